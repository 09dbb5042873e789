"""Training on several processes (torchrun): the process group, DDP / FSDP2 applied from outside the model, the
vocabulary-sharded PLE table and sharded (torch.distributed.checkpoint) checkpoints.

The model code stays single-device (torchtitan style): `plelab.parallel.engine.Parallel.wrap` swaps the PLE
table for a `ShardedEmbedding` and wraps the rest in DDP or `fully_shard`. One process without torchrun never
touches this package's collectives.
"""
