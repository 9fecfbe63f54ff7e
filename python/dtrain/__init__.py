"""dtrain: distributed training whose errors say which rank, which peer and which operation.

``import dtrain.torch`` registers the ``torch.distributed`` backend ``"dtrain"``::

    import torch.distributed as dist
    import dtrain.torch  # noqa: F401  (registers the backend)
    dist.init_process_group("dtrain")

This module itself imports nothing heavy (in particular not torch).
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
