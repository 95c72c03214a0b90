"""NCCL fabric checks: NCCL_DEBUG=INFO logs and topology XML -> facts -> findings (docs/topo.md)."""
