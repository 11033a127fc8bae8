"""Embedding-dominated models, where a node's update changes only the rows of its own data.

* ``lm`` -- a next-token language model: token and position embeddings, one
  pre-norm attention block in which the last position attends over the
  context (a transformer block with a single query, Vaswani et al. 2017), a
  feed-forward layer and an untied output layer over the whole vocabulary
  (50,000 tokens by default). Evaluation and DP-SGD use the full softmax.
  Plain training uses a *sampled softmax* (Jean et al. 2015, "On Using Very
  Large Target Vocabulary for Neural Machine Translation"; TensorFlow's
  ``sampled_softmax_loss`` with its log-uniform sampler, as LM1B models are
  trained): each example scores its own target against negatives drawn from a
  log-uniform (Zipf-like) distribution over token ids, with the log expected
  count subtracted and accidental hits removed. Only the output rows of the
  round's targets and negatives get a gradient, so the output table's update is
  row-sparse like the input embedding's. Token ids are expected in roughly
  decreasing frequency order (id 1 the most frequent), as Zipf data and
  frequency-sorted vocabularies are. Token 0 is padding and is masked out.
* ``hashed_rec`` -- a recommender over categorical features (user, item,
  category, ...) hashed into one shared embedding table (the "hashing trick",
  Weinberger et al. 2009, as large-scale recommendation platforms do for
  dynamic features): any int64 id, including one never seen before, maps to a
  bucket with no vocabulary and no rebuild; the table's size is fixed by the job.

fl_node.models registers both factories (this module imports nothing of it).
"""

from __future__ import annotations

import math

import torch
from torch import nn

_PADDING = 0


class NextTokenLM(nn.Module):
    """Context tokens ``(N, context)`` -> next-token logits ``(N, vocab_size)``."""

    proposal: torch.Tensor  # a buffer

    def __init__(self, vocab_size: int, context: int, embed_dim: int, hidden: int, sampled: int) -> None:
        super().__init__()
        if vocab_size < 2 or context < 1 or embed_dim < 1 or hidden < 1 or sampled < 0:
            raise ValueError("lm needs vocab_size >= 2 and positive context, embed_dim and hidden")
        self.vocab_size, self.context, self.sampled = vocab_size, context, sampled
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.position = nn.Embedding(context, embed_dim)
        self.norm = nn.LayerNorm(embed_dim)
        self.query = nn.Linear(embed_dim, embed_dim)
        self.key = nn.Linear(embed_dim, embed_dim)
        self.value = nn.Linear(embed_dim, embed_dim)
        self.mix = nn.Linear(embed_dim, embed_dim)
        self.ff_norm = nn.LayerNorm(embed_dim)
        self.ff = nn.Sequential(nn.Linear(embed_dim, hidden), nn.Tanh(), nn.Linear(hidden, embed_dim))
        self.out_norm = nn.LayerNorm(embed_dim)
        self.output = nn.Linear(embed_dim, vocab_size, bias=False)
        ranks = torch.arange(vocab_size, dtype=torch.float64)
        log_uniform = torch.log((ranks + 2) / (ranks + 1)) / math.log(vocab_size + 1)
        self.register_buffer("proposal", log_uniform.to(torch.float32), persistent=False)

    def hidden_state(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.shape[1] != self.context:
            raise ValueError(f"lm takes (N, {self.context}) token ids, got {tuple(tokens.shape)}")
        tokens = tokens.long()  # a node's stored datasets hold features as float32 (exact ids < 2**24)
        # (N, context) position ids: per-example DP-SGD engines need a batch dimension on every input.
        positions = torch.arange(self.context, device=tokens.device).expand(tokens.shape[0], -1)
        x = self.embedding(tokens) + self.position(positions)
        h = self.norm(x)
        scores = self.query(h[:, -1:]) @ self.key(h).transpose(1, 2) / math.sqrt(h.shape[-1])
        padding = (tokens == _PADDING).unsqueeze(1)
        padding[:, :, -1] = False  # the last position always attends to itself
        weights = torch.softmax(scores.masked_fill(padding, float("-inf")), dim=-1)
        y = x[:, -1] + self.mix((weights @ self.value(h)).squeeze(1))
        y = y + self.ff(self.ff_norm(y))
        return self.out_norm(y)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.output(self.hidden_state(tokens))

    def training_loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Sampled-softmax cross-entropy (full softmax when ``sampled`` is 0 or covers the vocabulary)."""
        hidden = self.hidden_state(tokens)
        if self.sampled == 0 or self.sampled >= self.vocab_size:
            return nn.functional.cross_entropy(self.output(hidden), targets)
        draws = torch.multinomial(self.proposal, self.sampled, replacement=True)
        negatives = torch.unique(draws)
        # Expected count of each id among `sampled` draws with replacement (TensorFlow's unique sampler).
        log_expected = torch.log(-torch.expm1(self.sampled * torch.log1p(-self.proposal)))
        weight = self.output.weight
        true_logit = (hidden * weight.index_select(0, targets)).sum(dim=1) - log_expected[targets]
        sampled_logit = hidden @ weight.index_select(0, negatives).T - log_expected[negatives]
        sampled_logit = sampled_logit.masked_fill(targets[:, None] == negatives[None, :], float("-inf"))
        logits = torch.cat([true_logit[:, None], sampled_logit], dim=1)
        return nn.functional.cross_entropy(logits, torch.zeros_like(targets))


def lm(
    *,
    input_shape: tuple[int, ...],
    vocab_size: int = 50_000,
    embed_dim: int = 32,
    hidden: int = 64,
    sampled: int = 256,
    num_classes: int | None = None,
) -> nn.Module:
    """Next-token LM; ``input_shape`` is ``(context,)``; ``num_classes``, if given, must equal the vocabulary."""
    if len(input_shape) != 1:
        raise ValueError(f"lm needs input_shape (context,), got {input_shape}")
    if num_classes is not None and num_classes != vocab_size:
        raise ValueError(
            f"lm predicts tokens: num_classes ({num_classes}) must equal vocab_size ({vocab_size})"
        )
    return NextTokenLM(vocab_size, input_shape[0], embed_dim, hidden, sampled)


# ---------------------------------------------------------------- hashed recommender

_PRIME = 2_147_483_647  # 2**31 - 1: products of two residues stay below 2**62, exact in int64
_MULTIPLIER = 1_103_515_245
_GOLDEN = 2_654_435_761


def hash_buckets(ids: torch.Tensor, buckets: int) -> torch.Tensor:
    """Bucket of each (N, F) int64 id in a table of ``buckets`` rows, salted per field (column).

    A fixed universal hash ``((id mod p) * a + salt_f) mod p mod buckets``: the same
    on every node and platform (exact int64 arithmetic), defined for any id,
    negative or never seen before.
    """
    if ids.dtype != torch.int64 or ids.dim() != 2:
        raise ValueError(
            f"hashed ids must be an (N, fields) int64 tensor, got {ids.dtype} {tuple(ids.shape)}"
        )
    salts = (torch.arange(1, ids.shape[1] + 1, dtype=torch.int64) * _GOLDEN) % _PRIME
    mixed = (torch.remainder(ids, _PRIME) * _MULTIPLIER + salts) % _PRIME
    return mixed % buckets


class HashedFeatureRecommender(nn.Module):
    """(N, fields) raw int64 feature ids -> hashed embeddings, concatenated -> MLP -> class logits."""

    def __init__(self, fields: int, buckets: int, embed_dim: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        if fields < 1 or buckets < 1 or embed_dim < 1 or hidden < 1:
            raise ValueError("hashed_rec needs positive fields, buckets, embed_dim and hidden")
        self.buckets = buckets
        self.table = nn.Embedding(buckets, embed_dim)
        self.mlp = nn.Sequential(
            nn.Linear(fields * embed_dim, hidden), nn.Tanh(), nn.Linear(hidden, num_classes)
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.table(hash_buckets(ids, self.buckets)).flatten(1))


def hashed_rec(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    buckets: int = 100_000,
    embed_dim: int = 16,
    hidden: int = 64,
) -> nn.Module:
    if len(input_shape) != 1:
        raise ValueError(f"hashed_rec needs input_shape (fields,), got {input_shape}")
    return HashedFeatureRecommender(input_shape[0], buckets, embed_dim, hidden, num_classes)
