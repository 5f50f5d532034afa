"""Tools beside the pipeline: the model zoo, the numerical check, timing and profiling of
sessions, plots, the Netron view and the test-model builders. None of them is a pipeline stage;
the CLI and the tests use them."""
