"""The bounds of a job and a dataset, stated once: the one table.

Read by the job configuration's checks (fl_node/job/config.py), the checks a node makes on a job
proposed elsewhere (backend/jobs/remote_config.py), the API's request serializers
(min_value/max_value), the datasets' cap check, and the dashboard's job form (through
``GET /api/jobs/limits``). The contracts hold the same numbers as Solidity constants (a fixed-size
committee array cannot take its size at deployment): tests/contracts/test_limits.py reads them from
the deployed contracts' ABI and asserts they equal these, so the two cannot drift apart.

Plain Python (fl_node imports no Django): the node, the simulator and the benchmarks read it alike.
"""

from __future__ import annotations

from typing import Final

from fl_node.committee import MAX_SCORE

DAY_S: Final = 24 * 3600

# ------------------------------------------------------------------ on chain (FederatedLearning)
MAX_ROUNDS: Final = 10_000  # FederatedLearning.MAX_ROUNDS
# 15 seats of 16 bits under a 16-bit round tag fill one score slot: FederatedLearning.MAX_COMMITTEE
MAX_COMMITTEE: Final = 15
MAX_TOP_K: Final = 255  # the contract stores topK as a uint8
# committee_size + min_trainers may not exceed it: FederatedLearning.MAX_PARTICIPANTS
MAX_PARTICIPANTS: Final = 200
MAX_MARGIN_BP: Final = MAX_SCORE  # FederatedLearning.MAX_SCORE (basis points)
MAX_PERIOD_S: Final = 7 * DAY_S  # round_timeout_s, score_timeout_s: FederatedLearning.MAX_PERIOD
MAX_JOIN_TIMEOUT_S: Final = 30 * DAY_S
# FederatedLearning.MAX_JOIN_WINDOW is a day longer than the API allows: slack for a chain whose
# latest timestamp lags the proposer's clock.
JOIN_WINDOW_SLACK_S: Final = DAY_S
MAX_JOIN_WINDOW_S: Final = MAX_JOIN_TIMEOUT_S + JOIN_WINDOW_SLACK_S

# ------------------------------------------------------------------ privacy (DataRegistry)
MICRO_EPSILON: Final = 1_000_000  # the chain counts privacy in micro-epsilon (uint64)
MAX_EPSILON_CAP: Final = 100.0  # a dataset's epsilon cap: DataRegistry.MAX_PRIVACY_CAP / MICRO_EPSILON
MAX_PRIVACY_CAP_MICRO: Final = int(MAX_EPSILON_CAP * MICRO_EPSILON)  # DataRegistry.MAX_PRIVACY_CAP
# One round's spend by one participant: FederatedLearning.MAX_SPEND_PER_ROUND (the largest cap).
MAX_SPEND_PER_ROUND_MICRO: Final = MAX_PRIVACY_CAP_MICRO
# A job's target epsilon: no dataset's cap is larger, so no dataset could join a job above it.
MAX_TARGET_EPSILON: Final = MAX_EPSILON_CAP

# ------------------------------------------------------------------ the job configuration only
MAX_JOB_NAME: Final = 200
MAX_LOCAL_EPOCHS: Final = 1_000
MAX_BATCH_SIZE: Final = 65_536
# adaptive_work: the most local steps a job may let a round run (bounds every trainer's work, the
# privacy calibration and the step count an update may claim); at least MIN_LOCAL_STEPS.
MIN_LOCAL_STEPS: Final = 4
MAX_LOCAL_STEPS: Final = 100_000
MAX_SPARSE_TABLES: Final = 64  # a model's tensors named as sparse tables
MAX_TENSOR_NAME: Final = 200
MAX_PUBLIC_ROWS: Final = 1 << 24
MAX_LINK_MBIT: Final = 8e6
NORM_BOUND_BELOW: Final = 1e30  # norm_bound is 0 (no bound) or a positive number below this
# The job's seed seeds every round's training as seed * 1_000_003 + round * 1009 + index
# (fl_node.job.training.round_seed): below 2^31 that stays far inside torch's 64-bit seeds.
MAX_SEED: Final = 2**31 - 1
MAX_LR: Final = 1e3
# Noise calibration searches over these: they keep a private job where the accountants are well
# defined (a job's target epsilon is bounded by MAX_TARGET_EPSILON above).
MIN_DELTA: Final = 1e-30
MAX_CLIP_NORM: Final = 1e6

# ------------------------------------------------------------------ a job proposed by another node
# What a node checks of a config it fetched before it builds the model (backend/jobs/remote_config.py).
MAX_INPUT_DIMS: Final = 4
MAX_INPUT_ELEMENTS: Final = 1 << 24  # one sample; only used when the node has no dataset of the schema
MAX_CLASSES: Final = 1 << 20  # language models predict tokens: num_classes = vocab_size
MAX_OPTIONS: Final = 16  # entries of model_options and of strategy_params
MAX_OPTION_LIST: Final = 8
MAX_OPTION_INT: Final = 1 << 22
MAX_OPTION_TEXT: Final = 32
# Options that drive loops or per-option allocations in a factory, bounded per model. Options
# of models not listed here get only the generic bounds, and the parameter count.
MODEL_OPTION_BOUNDS: Final[dict[str, dict[str, tuple[int, int]]]] = {
    "mlp": {"hidden": (1, 65_536)},
    "cnn": {"channels": (1, 4_096), "hidden": (1, 65_536), "groups": (0, 4_096)},
    "text": {"vocab_size": (1, 1 << 22), "embed_dim": (1, 4_096)},
    "scatternet": {"scales": (1, 4), "orientations": (1, 16), "groups": (0, 1_024)},
}


def as_dict() -> dict[str, int | float]:
    """The limits the API serves (``GET /api/jobs/limits``), by the job field each bounds."""
    return {
        "max_rounds": MAX_ROUNDS,
        "max_local_epochs": MAX_LOCAL_EPOCHS,
        "max_batch_size": MAX_BATCH_SIZE,
        "max_committee": MAX_COMMITTEE,
        "max_top_k": MAX_TOP_K,
        "max_participants": MAX_PARTICIPANTS,
        "max_margin_bp": MAX_MARGIN_BP,
        "max_period_s": MAX_PERIOD_S,
        "max_join_timeout_s": MAX_JOIN_TIMEOUT_S,
        "max_target_epsilon": MAX_TARGET_EPSILON,
        "max_epsilon_cap": MAX_EPSILON_CAP,
        "min_local_steps": MIN_LOCAL_STEPS,
        "max_local_steps": MAX_LOCAL_STEPS,
        "max_sparse_tables": MAX_SPARSE_TABLES,
        "max_public_rows": MAX_PUBLIC_ROWS,
        "max_link_mbit": MAX_LINK_MBIT,
        "max_job_name": MAX_JOB_NAME,
        "max_seed": MAX_SEED,
        "max_lr": MAX_LR,
    }
