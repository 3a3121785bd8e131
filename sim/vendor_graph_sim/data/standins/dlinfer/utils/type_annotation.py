"""MoE annotations lmdeploy's Ascend backend imports (names and defaults as in dlinfer 0.2.7)."""

from dataclasses import dataclass
from enum import Enum, auto
from typing import Any


class MoECommType(Enum):
    NAIVE = auto()
    ALLGATHER = auto()
    ALLTOALL = auto()
    MC2 = auto()
    TP = auto()
    UNDEFINED = auto()


@dataclass
class MoeMetadata:
    max_tokens_across_dp: int = 1
    pad_size: int = 0
    dp_size: int = 1
    tp_size: int = 1
    ep_size: int = 1
    tp_rank: int = 0
    ep_rank: int = 0
    tp_group: Any = None
    ep_group: Any = None
    moe_comm_type: MoECommType = MoECommType.UNDEFINED
    x_active_mask: Any = None
    moe_group_name: Any = None
    expert_ids_per_ep_rank: Any = None
    router_n_groups: int = -1
