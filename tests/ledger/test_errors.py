"""One table from every custom error in the artifacts to a typed exception; pure decoding."""

from __future__ import annotations

import pytest
from django.test import override_settings
from eth_abi import encode
from eth_utils import function_signature_to_4byte_selector

from backend.ledger import errors, factory
from backend.ledger.artifacts import all_artifacts
from devnet.consortium import dev_account, overlay_of, public_key


def test_every_custom_error_has_a_typed_exception():
    declared = {item["name"] for a in all_artifacts() for item in a.abi if item["type"] == "error"}
    assert declared == set(errors.ERROR_TYPES)
    for cls in errors.ERROR_TYPES.values():
        assert issubclass(cls, errors.ContractRevert) and issubclass(cls, errors.LedgerError)


def test_decode_revert_names_arguments():
    data = function_signature_to_4byte_selector(
        "PrivacyBudgetExceeded(uint256,uint64,uint64,uint64)"
    ) + encode(["uint256", "uint64", "uint64", "uint64"], [3, 90, 20, 100])
    exc = errors.decode_revert(data)
    assert isinstance(exc, errors.PrivacyBudgetExceeded)
    assert exc.args_ == {"datasetId": 3, "spent": 90, "requested": 20, "cap": 100}
    assert "cap=100" in str(exc) and exc.error == "PrivacyBudgetExceeded"


def test_decode_standard_and_unknown_reverts():
    reason = errors.decode_revert(bytes.fromhex("08c379a0") + encode(["string"], ["nope"]))
    assert isinstance(reason, errors.RevertedWithReason) and "nope" in str(reason)
    assert isinstance(
        errors.decode_revert(bytes.fromhex("4e487b71") + encode(["uint256"], [0x11])), errors.Panic
    )
    assert isinstance(errors.decode_revert(b"\xde\xad\xbe\xef"), errors.UnknownRevert)
    assert isinstance(errors.decode_revert(b""), errors.UnknownRevert)


@pytest.mark.django_db
def test_factory_embedded_chain_deploys_in_process(tmp_path):
    key = "0x" + dev_account(7, "factory").key.hex().removeprefix("0x")
    with override_settings(
        DEFL_CHAIN_URL="",
        DEFL_NODE_KEY=key,
        DEFL_CONTRACTS_FILE=str(tmp_path / "contracts.json"),
        DEFL_LEDGER_LOCK_DIR=str(tmp_path / "locks"),
    ):
        factory.reset()
        try:
            ledger = factory.get_ledger()
            assert factory.get_ledger() is ledger
            assert not (tmp_path / "contracts.json").exists()  # in-process contracts die with the process
            account = ledger.client.account
            ledger.nodes.register_node(
                "solo", "http://solo.test", public_key(account), overlay_of(account.address)
            )
            assert ledger.nodes.members() == [account.address]
            result = factory.get_indexer(ledger).sync()
            # SpenderWired (the deployment wires DataRegistry to FederatedLearning), NodeApplied, NodeAdmitted
            assert result.new_events == 3
        finally:
            factory.reset()


def test_factory_without_contracts_on_a_real_chain_says_what_to_do(tmp_path):
    with override_settings(DEFL_CHAIN_URL="http://127.0.0.1:9", DEFL_NODE_KEY="0x" + "11" * 32):
        factory.reset()
        try:
            with pytest.raises(errors.LedgerError):
                factory.get_ledger()
        finally:
            factory.reset()
