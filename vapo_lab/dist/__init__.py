"""One run on many ranks with torch's own engines: the process group (:mod:`~vapo_lab.dist.world`),
FSDP2 sharding (:mod:`~vapo_lab.dist.fsdp`), torch distributed checkpoints
(:mod:`~vapo_lab.dist.checkpoint`) and the torchrun command (:mod:`~vapo_lab.dist.launch`).

``trainer.strategy=single`` never touches this package beyond :func:`~vapo_lab.dist.world.single`;
``trainer.strategy=fsdp`` runs the same loop on every rank, each with its share of the step's
prompts, and every statistic that defines the update reduced over ranks.
"""
