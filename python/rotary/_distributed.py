"""The old name of :mod:`rotary.torch.distributed` (context parallelism), kept as an alias."""
import sys

from .torch import distributed as _distributed

sys.modules[__name__] = _distributed
