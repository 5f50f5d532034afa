"""Pipeline stage "plan": which layers fuse into one block, and on how many cores each runs.

``plan`` is the contract (a :class:`~onnxmlu.plan.plan.Plan` of blocks, JSON in and out),
``strategies`` the algorithms that make one, ``perf`` the simulated accelerator's clock that
prices them, and ``planner`` the stage itself: run a strategy or read a plan, force an MP, split
bodies over the size limit, price every block. Nothing in this package imports onnx: it works
on :class:`~onnxmlu.plan.perf.layers.Layer` records, so it can be tested on synthetic chains.
"""
