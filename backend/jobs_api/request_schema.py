"""The OpenAPI schema of ``POST /api/jobs``: every rule of the request alone, so a client (and the
fuzz) can tell a valid job from one the node refuses with a 400.

drf-spectacular maps each field of JobCreateSerializer with its bounds; this adds what one field
cannot say alone: the options each model takes and the parameters each strategy takes
(``oneOf`` / ``anyOf`` by name), DP's fields by its mode, adaptive work's pairing with
``max_local_steps`` and FedAvg, a sparse table list for ``public_rows``, and the exclusive
bounds. What then depends on this node's state (the dataset's shape and size, its budget, the
node's limits, the deployment, the members that can join) is a 409, never a 400.

The tables below are checked against the registries (tests/backend/test_job_request_schema.py):
a model or strategy added without its entry here fails that test.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiSerializerExtension

from fl_node.aggregate import ROW_RULES
from fl_node.job.limits import MAX_OPTION_INT, MAX_OPTION_LIST, MAX_OPTION_TEXT, MODEL_OPTION_BOUNDS

INT_OPTION = {"type": "integer", "minimum": 1, "maximum": MAX_OPTION_INT}
ACTIVATIONS = ["elu", "relu", "tanh"]  # fl_node.models._ACTIVATIONS


def _int_option(model: str, name: str, low: int = 1) -> dict:
    bounds = MODEL_OPTION_BOUNDS.get(model, {}).get(name)
    low, high = bounds if bounds else (low, MAX_OPTION_INT)
    return {"type": "integer", "minimum": low, "maximum": high}


def _model_options() -> dict[str, dict]:
    """Each registered model's options (fl_node.models and fl_node.sparse_models factories)."""
    return {
        "mlp": {"hidden": _int_option("mlp", "hidden"), "act": {"type": "string", "enum": ACTIVATIONS}},
        "cnn": {
            "channels": {
                "type": "array",
                "items": _int_option("cnn", "channels"),
                "minItems": 2,
                "maxItems": 2,
            },
            "hidden": _int_option("cnn", "hidden"),
            "act": {"type": "string", "enum": ACTIVATIONS},
            "groups": _int_option("cnn", "groups"),
        },
        "text": {
            "vocab_size": _int_option("text", "vocab_size"),
            "embed_dim": _int_option("text", "embed_dim"),
        },
        "scatternet": {
            "scales": _int_option("scatternet", "scales"),
            "orientations": _int_option("scatternet", "orientations"),
            "groups": _int_option("scatternet", "groups"),
        },
        "lm": {name: INT_OPTION for name in ("vocab_size", "embed_dim", "hidden", "sampled")},
        "hashed_rec": {name: INT_OPTION for name in ("buckets", "embed_dim", "hidden")},
    }


def _unit(*, closed_high: bool = False) -> dict:
    return {"type": "number", "minimum": 0, "maximum": 1, "exclusiveMaximum": not closed_high}


def _positive_number() -> dict:
    return {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": MAX_OPTION_INT}


def _strategy_params() -> dict[str, dict]:
    """Each registered strategy's parameters (fl_node.aggregate), with the ranges it checks."""
    adaptive = {"lr": _positive_number(), "beta1": _unit(), "beta2": _unit(), "tau": _positive_number()}
    return {
        "fedavg": {},
        "median": {},
        "fedprox": {"mu": {"type": "number", "minimum": 0, "maximum": MAX_OPTION_INT}},
        "fedadam": adaptive,
        "fedyogi": adaptive,
        "trimmed_mean": {"beta": {"type": "number", "minimum": 0, "maximum": 0.5, "exclusiveMaximum": True}},
        "krum": {"f": {"type": "integer", "minimum": 0, "maximum": MAX_OPTION_INT}},
        "multi_krum": {
            "f": {"type": "integer", "minimum": 0, "maximum": MAX_OPTION_INT},
            "m": {"type": "integer", "minimum": 1, "maximum": MAX_OPTION_INT, "nullable": True},
        },
        "hybrid": {
            "sparse_names": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": MAX_OPTION_TEXT},
                "maxItems": MAX_OPTION_LIST,
            },
            "rows": {"type": "string", "enum": list(ROW_RULES)},
        },
    }


MODEL_OPTIONS = _model_options()
STRATEGY_PARAMS = _strategy_params()


def _options(properties: dict) -> dict:
    schema: dict = {"type": "object", "properties": properties, "additionalProperties": False}
    if not properties:
        schema["maxProperties"] = 0
    return schema


def _by_model() -> dict:
    return {
        "oneOf": [
            {
                "type": "object",
                "properties": {
                    "model": {"type": "string", "enum": [model]},
                    "model_options": _options(options),
                },
                "required": ["model"],
            }
            for model, options in MODEL_OPTIONS.items()
        ]
    }


def _by_strategy() -> dict:
    branches = []
    for strategy, params in STRATEGY_PARAMS.items():
        branch = {
            "type": "object",
            "properties": {
                "strategy": {"type": "string", "enum": [strategy]},
                "strategy_params": _options(params),
            },
        }
        if strategy != "fedavg":  # no strategy: FedAvg, which takes no parameters
            branch["required"] = ["strategy"]
        branches.append(branch)
    return {"anyOf": branches}


def _adaptive_work() -> dict:
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "adaptive_work": {"type": "boolean", "enum": [False]},
                    "max_local_steps": {"maximum": 0},
                },
            },
            {
                "type": "object",
                "properties": {
                    "adaptive_work": {"type": "boolean", "enum": [True]},
                    "strategy": {"type": "string", "enum": ["fedavg"]},
                    "max_local_steps": {"type": "integer", "minimum": 4},
                },
                "required": ["adaptive_work", "max_local_steps"],
            },
        ]
    }


def job_create_schema(base: dict) -> dict:
    """The request schema: drf-spectacular's mapping of JobCreateSerializer plus the rules above."""
    properties = dict(base["properties"])
    properties["lr"] = {**properties["lr"], "exclusiveMinimum": True}
    properties["norm_bound"] = {**properties["norm_bound"], "exclusiveMaximum": True}
    properties["model_options"] = {
        "type": "object",
        "description": "options of the chosen model (oneOf below)",
    }
    properties["strategy_params"] = {
        "type": "object",
        "description": "parameters of the chosen strategy (anyOf below)",
    }
    return {
        **base,
        "properties": properties,
        "allOf": [_by_model(), _by_strategy(), _adaptive_work()],
    }


class JobCreateSchema(OpenApiSerializerExtension):
    target_class = "backend.jobs_api.serializers.JobCreateSerializer"

    def map_serializer(self, auto_schema, direction):
        return job_create_schema(auto_schema._map_basic_serializer(self.target, direction))


class DPRequestSchema(OpenApiSerializerExtension):
    """A job's DP settings: a mode, and for a private mode its target epsilon, delta and clip norm."""

    target_class = "backend.jobs_api.serializers.DPSerializer"

    def map_serializer(self, auto_schema, direction):
        base = auto_schema._map_basic_serializer(self.target, direction)
        properties = dict(base["properties"])
        properties["target_epsilon"] = {**properties["target_epsilon"], "exclusiveMinimum": True}
        properties["delta"] = {**properties["delta"], "exclusiveMaximum": True}
        properties["max_grad_norm"] = {**properties["max_grad_norm"], "exclusiveMinimum": True}
        return {**base, "properties": properties, "required": ["mode", "target_epsilon"]}


class SparseRequestSchema(OpenApiSerializerExtension):
    """How trainers encode updates; ``public_rows`` needs the tables it keeps rows of."""

    target_class = "backend.jobs_api.serializers.SparseSerializer"

    def map_serializer(self, auto_schema, direction):
        base = auto_schema._map_basic_serializer(self.target, direction)
        if "tables" in base.get("properties", {}):  # a tensor named twice is a 400
            base["properties"]["tables"] = {**base["properties"]["tables"], "uniqueItems": True}
        rule = [
            {"type": "object", "properties": {"public_rows": {"maximum": 0}}},
            {
                "type": "object",
                "properties": {"tables": {"type": "array", "minItems": 1}},
                "required": ["tables"],
            },
        ]
        return {**base, "anyOf": rule}


class StartRequestSchema(OpenApiSerializerExtension):
    """Nothing to send: the first committee is drawn on chain, so a ``committee`` is refused (400)."""

    target_class = "backend.jobs_api.serializers.StartSerializer"

    def map_serializer(self, auto_schema, direction):
        return {"type": "object", "properties": {}, "not": {"required": ["committee"]}}
