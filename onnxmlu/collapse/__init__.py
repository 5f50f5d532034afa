"""Pipeline stages "collapse" and "write": each planned block becomes one MLUFusionBlock node
(``blocks``), and the fused model reaches the disk whole or never (``atomic``)."""
