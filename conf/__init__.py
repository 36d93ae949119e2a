"""vapo-lab's Hydra config tree, shipped inside the package as ``vapo_lab.conf``."""
