"""The job request's schema covers every registered model and strategy with what each accepts."""

from __future__ import annotations

import inspect

from backend.jobs_api.request_schema import MODEL_OPTIONS, STRATEGY_PARAMS
from fl_node import aggregate, models


def test_every_registered_model_has_its_options_in_the_schema():
    assert set(MODEL_OPTIONS) == set(models.available_models())
    for name, options in MODEL_OPTIONS.items():
        accepted = set(inspect.signature(models._resolve(name)).parameters) - {"input_shape", "num_classes"}
        assert set(options) <= accepted, name  # the schema offers nothing the factory does not take
        assert accepted - set(options) <= {"seed"}, (name, accepted - set(options))  # and hides nothing


def test_every_registered_strategy_has_its_parameters_in_the_schema():
    assert set(STRATEGY_PARAMS) == set(aggregate.available_strategies())
    for name, params in STRATEGY_PARAMS.items():
        signature = inspect.signature(aggregate._REGISTRY[name].__init__).parameters
        kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        named = {p for p, spec in signature.items() if p != "self" and spec.kind in kinds}
        assert set(params) == named, (name, set(params), named)  # FedAvg and median take none
