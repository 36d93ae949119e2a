"""vapo-lab: reproduce, ablate and extend VAPO (arXiv 2504.05118), from a laptop to a cluster."""

__version__ = "0.1.0"
