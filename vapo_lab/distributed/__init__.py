"""One run on many ranks with torch's own engines: the process group (:mod:`~vapo_lab.distributed.world`),
FSDP2 sharding (:mod:`~vapo_lab.distributed.fsdp`), torch distributed checkpoints
(:mod:`~vapo_lab.distributed.dcp`), the torchrun command (:mod:`~vapo_lab.distributed.launch`) and
the training state's trips to host memory around a rollout (:mod:`~vapo_lab.distributed.offload`).

``trainer.strategy=single`` never touches this package beyond :func:`~vapo_lab.distributed.world.single`;
``trainer.strategy=fsdp`` runs the same loop on every rank, each with its share of the step's
prompts, and every statistic that defines the update reduced over ranks.
"""
