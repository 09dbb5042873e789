"""The FFN-sharing study (docs/ffn-study.md): which FFN saves bytes for the least loss? Variants (MGLU, low-rank,
pruned, MoE, a narrow SwiGLU) paired by seed against SwiGLU, per domain and over training."""
