"""Tasks: families behind one plug-in interface, addressed by :class:`~protocol.types.TaskRef`; answers; the split.

* ``family``        -- the interface a task family implements, ``TaskItem``, the errors a receiver counts
* ``registry``      -- find a family by name (installed plug-ins: entry point group ``rl_swarm.tasks``)
* ``builtin``       -- reasoning-gym datasets and the laboratory families as families (trusted, unversioned)
* ``verifiers_env`` -- a single-turn verifiers environment as a family (``verifiers:<module>``)
* ``guard``         -- a plug-in's calls under a time limit; quarantine of one that hangs
* ``answer``        -- the ``<answer>`` format: the prompt's instruction, extraction, exact match
* ``split``         -- the three-sided split by a hash of the canonical problem (SPEC 13)
* ``source``        -- ``TaskSource``: draw refs, materialize own and peers' refs, score, write traces

Layers, top to bottom (an import-linter contract): ``source`` -> ``registry`` -> ``verifiers_env`` | ``builtin`` |
``guard`` -> ``answer`` | ``split`` -> ``family``.
"""

from node.tasks.answer import (
    ANSWER_CLOSE,
    ANSWER_INSTRUCTION,
    ANSWER_OPEN,
    PLAIN_TEMPLATE,
    extract_answer,
    format_answer,
    is_exact,
)
from node.tasks.builtin import DEFAULT_SIZE
from node.tasks.family import (
    ENTRY_POINT_GROUP,
    Family,
    HeldOutError,
    PluginError,
    TaskError,
    TaskItem,
    split_wire_family,
    wire_family,
)
from node.tasks.registry import resolve_family
from node.tasks.source import SAPO_FAMILIES, TaskSource
from node.tasks.split import (
    SIDES,
    Side,
    SplitShares,
    key_preimage,
    side_of_hash,
    split_hash,
    split_key,
    split_preimage,
    split_side,
)

__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_INSTRUCTION",
    "ANSWER_OPEN",
    "DEFAULT_SIZE",
    "ENTRY_POINT_GROUP",
    "PLAIN_TEMPLATE",
    "SAPO_FAMILIES",
    "SIDES",
    "Family",
    "HeldOutError",
    "PluginError",
    "Side",
    "SplitShares",
    "TaskError",
    "TaskItem",
    "TaskSource",
    "extract_answer",
    "format_answer",
    "is_exact",
    "key_preimage",
    "resolve_family",
    "side_of_hash",
    "split_hash",
    "split_key",
    "split_preimage",
    "split_side",
    "split_wire_family",
    "wire_family",
]
