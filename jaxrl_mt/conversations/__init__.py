"""The batched multi-turn runner shared by RL history generation, LiC evaluation and SeDT.

All conversations of a batch advance in lockstep: at turn k every still-active conversation gets
its next user message from a user policy, then ONE batched sampler call answers all of them.
Nobody loops over conversations one at a time.

With ``reuse_cache=True`` each conversation keeps its KV cache between turns (a
``jaxrl_mt.sampling.DecodeSession``): a turn prefills only what is new since the last reply, i.e.
the reply's last sampled token (never fed during decoding) and the chat template's text between
that reply and the next generation prompt (see :func:`turn_suffix`). The model then sees exactly
the tokens it generated (no detokenize/retokenize round trip); a stop token that ended a reply is
replaced by the template's end-of-turn text, as a full re-render would do.

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
conversations share its batch, and a conversation redone on its own (a resumed evaluation)
equals the one of the uninterrupted run.
"""

from jaxrl_mt.conversations.records import (SEED_STRIDE, ConversationRun, FinalTurn, FixedOrderUser, TurnCallback,
                                            TurnRecord, UserPolicy, accepts_reuse_cache, row_seed, turn_suffix)
from jaxrl_mt.conversations.runner import run_conversations

__all__ = ["SEED_STRIDE", "ConversationRun", "FinalTurn", "FixedOrderUser", "TurnCallback", "TurnRecord", "UserPolicy",
           "accepts_reuse_cache", "row_seed", "run_conversations", "turn_suffix"]
