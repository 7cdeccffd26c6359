"""The batched multi-turn runner shared by RL history generation, LiC evaluation and SeDT.

With ``reuse_cache=True`` and a plain `Sampler` (the usual case; on one process or, every
process running every conversation, on a mesh over several), each conversation holds a slot of
the decode engine across its turns (`slotted`, over `sampling.turns`): conversations proceed
apart, a reply that ends gets its hooks (`on_turn`, the user policy, a `FinalTurn`) at once and
its next turn is appended to its slot's cache, and a slot freed by a finished conversation takes
the next waiting one; only conversations in flight hold a cache. Otherwise (``reuse_cache=False``,
a sampler of messages behind an API, a `generate_ids` override) all conversations advance in
lockstep (`runner`), without a cache: at turn k every still-active conversation gets its next
user message, then ONE batched call answers all of them, each prompt re-rendered and prefilled
whole (``reuse_cache=True`` there warns once).

A kept cache is reused only where it is exact: each turn's prompt is rendered and tokenised whole,
as without the cache, and when the token ids held in the slot (the earlier prompt and the
reply's tokens but its last, never fed during decoding) are its prefix, only the rest is fed. The
model thus conditions on exactly the tokens of the full re-render. Where they are not a prefix (a
reply that re-tokenises otherwise, a reply edited by `on_turn`, a template that rewrites earlier
turns: Qwen3's drops the think blocks of earlier replies, and in no-think mode the empty think
block of earlier generation prompts) the conversation starts over in its slot with its whole
prompt (logged once). `turn_suffix` is the template's text between a reply and the next
generation prompt (a check of whether a template is prefix-preserving).

Each conversation samples with its own key: its row seed (:func:`row_seed`) is a hash of its
``conv_id`` and turn index, so a conversation's turn draws the same tokens whichever other
conversations share its batch or its schedule (slotted or lockstep, up to the rounding of other
shapes), and a conversation redone on its own (a resumed evaluation) equals the one of the
uninterrupted run.
"""

from jaxrl_mt.conversations.records import (SEED_STRIDE, ConversationRun, FinalTurn, FixedOrderUser, TurnCallback,
                                            TurnRecord, UserPolicy, accepts_reuse_cache, row_seed, turn_suffix)
from jaxrl_mt.conversations.runner import run_conversations

__all__ = ["SEED_STRIDE", "ConversationRun", "FinalTurn", "FixedOrderUser", "TurnCallback", "TurnRecord", "UserPolicy",
           "accepts_reuse_cache", "row_seed", "run_conversations", "turn_suffix"]
