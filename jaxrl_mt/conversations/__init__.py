"""The batched multi-turn runner shared by RL history generation, LiC evaluation and SeDT.

With ``reuse_cache=True`` and a plain one-process `Sampler` (the usual case), each conversation
holds a slot of the decode engine across its turns (`slotted`, over `sampling.turns`):
conversations proceed apart, a reply that ends gets its hooks (`on_turn`, the user policy, a
`FinalTurn`) at once and its next turn is appended to its slot's cache, and a slot freed by a
finished conversation takes the next waiting one; only conversations in flight hold a cache.
Otherwise (``reuse_cache=False``, a sampler of messages behind an API, a `generate_ids`
override, a mesh over several processes, or a `DecodeSession` passed in) all conversations
advance in lockstep (`runner`): at turn k every still-active conversation gets its next user
message, then ONE batched call answers all of them (re-rendered and prefilled whole, or, with a
session, continued on its `DecodeSession` row: `cached`).

A kept cache prefills only what is new since the last reply: the reply's last sampled token
(never fed during decoding) and the chat template's text between that reply and the next
generation prompt (see :func:`turn_suffix`). The model then sees exactly the tokens it generated
(no detokenize/retokenize round trip); a stop token that ended a reply is replaced by the
template's end-of-turn text, as a full re-render would do.

The cache is valid only while the template is prefix-preserving for that conversation: the
previous prompt as rendered, followed by the reply verbatim, must be a prefix of the new
prompt's rendering. This is checked per conversation at every turn (with the real reply, not a
stand-in: Qwen3's template drops the think blocks of earlier replies, and in no-think mode the
empty think block of earlier generation prompts, so it rewrites exactly the turns whose reply
or prompt holds one). Where the check fails the conversation's row is emptied and its whole
prompt prefilled from scratch (logged once); a cache that differs from the rendered prompt is
never reused.

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
