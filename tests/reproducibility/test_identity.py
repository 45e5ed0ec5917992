"""rlvrlab.tracking.identity and .testbed: the digest of a set of weights (invariant to device, dict order and
strides; sensitive to any element, dtype or shape), the environment's keys, and a protocol's testbed block."""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rlvrlab.errors import RlvrlabError  # noqa: E402
from rlvrlab.tracking import tags as T, testbed  # noqa: E402
from rlvrlab.tracking.identity import environment, environment_tags, state_digest  # noqa: E402

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool)


def _state(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {"b.weight": (torch.randn(3, 4, generator=gen) * 3).to(dtype), "a.bias": torch.randn(4, generator=gen)
            .to(dtype), "c.scalar": torch.tensor(2.5).to(dtype)}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_digest_does_not_depend_on_dict_order_strides_or_copies(dtype) -> None:
    state = _state(dtype)
    digest = state_digest(state)
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert state_digest(dict(reversed(list(state.items())))) == digest
    strided = {**state, "b.weight": state["b.weight"].T.contiguous().T}  # same values, other strides
    assert not strided["b.weight"].is_contiguous() and state_digest(strided) == digest
    assert state_digest({k: v.clone() for k, v in state.items()}) == digest


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_digest_does_not_depend_on_the_device() -> None:
    state = _state(torch.bfloat16)
    assert state_digest({k: v.cuda() for k, v in state.items()}) == state_digest(state)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_digest_changes_with_one_element_a_dtype_a_shape_or_a_key(dtype) -> None:
    state = _state(dtype)
    digest = state_digest(state)
    changed = {k: v.clone() for k, v in state.items()}
    flat = changed["b.weight"].view(-1)
    flat[5] = ~flat[5] if dtype == torch.bool else flat[5] + 1
    assert state_digest(changed) != digest
    assert state_digest({**state, "b.weight": state["b.weight"].reshape(4, 3)}) != digest
    assert state_digest({"z" + k: v for k, v in state.items()}) != digest
    other = torch.float32 if dtype != torch.float32 else torch.float64
    assert state_digest({**state, "c.scalar": state["c.scalar"].to(other)}) != digest


def test_environment_has_its_keys_as_tags() -> None:
    env = environment()
    assert {"python", "torch", "transformers", "numpy", "device", "cpu_capability", "threads",
            "deterministic"} <= env.keys()
    assert env["torch"] == torch.__version__ and env["threads"] == str(torch.get_num_threads())
    assert ("cuda" in env) == torch.cuda.is_available()
    assert environment_tags() == {T.ENV_PREFIX + key: value for key, value in env.items()}
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert environment()["threads"] == "1"  # read when called: the threads in force
    finally:
        torch.set_num_threads(before)


DIGEST = "0123456789abcdef" * 4


def _protocol(tmp_path: Path, block: str, *, last: bool = False) -> Path:
    """A protocol holding `block` among prose and a verdict block (after it; last: nothing after it)."""
    path = tmp_path / "protocol.md"
    tail = "" if last else "\n## Verdict\n\n```verdict\nrules: []\n```\n"
    path.write_text(f"# A study\n\nSome prose.\n\n{block}\n{tail}")
    return path


def test_testbed_block_is_read_and_checked(tmp_path) -> None:
    path = _protocol(tmp_path, f"```testbed\ninitial_model_sha256: {DIGEST.upper()}   # the pairs warm start\n```\n")
    bed = testbed.load(path)
    assert bed.sha256 == DIGEST and bed.check(DIGEST) == {}
    with pytest.raises(RlvrlabError) as refused:
        bed.check("f" * 64)
    message = str(refused.value)
    assert "\n" not in message and "ffffffffffff" in message and DIGEST[:12] in message
    assert str(path) in message and "--allow-initial-model-change" in message
    allowed = testbed.load(path, allow_change=True)
    assert allowed.check("f" * 64) == {T.INITIAL_MODEL_OVERRIDE: "true", T.INITIAL_MODEL_EXPECTED: DIGEST}
    assert allowed.options() == ["--protocol", str(path), "--allow-initial-model-change"]
    # digits and one "e": YAML would read a float; the block is read as text
    numeric = "1" * 10 + "e" + "2" * 53
    assert testbed.load(_protocol(tmp_path, f"```testbed\ninitial_model_sha256: {numeric}\n```")).sha256 == numeric


def test_a_protocol_without_a_testbed_fixes_nothing(tmp_path) -> None:
    bed = testbed.load(_protocol(tmp_path, ""))
    assert bed.sha256 is None and bed.check("f" * 64) == {}
    assert testbed.optional(None, True) is None


@pytest.mark.parametrize("block, fragment", [
    ("```testbed\ninitial_model_sha256: abc\n```", "is not 64 hex digits"),
    ("```testbed\nmodel: x\n```", "must hold initial_model_sha256 alone"),
    (f"```testbed\ninitial_model_sha256: {DIGEST}\nother: 1\n```", "must hold initial_model_sha256 alone"),
    (f"```testbed\ninitial_model_sha256: {DIGEST}\n", "is not closed"),
    (f"```testbed\ninitial_model_sha256: {DIGEST}\n```\n```testbed\ninitial_model_sha256: {DIGEST}\n```",
     "2 ```testbed blocks"),
])
def test_bad_testbed_blocks_are_one_line(tmp_path, block, fragment) -> None:
    with pytest.raises(RlvrlabError, match=fragment) as bad:
        testbed.load(_protocol(tmp_path, block, last=True))
    assert "\n" not in str(bad.value) and "--protocol" in str(bad.value)


def test_a_missing_protocol_file_is_one_line(tmp_path) -> None:
    with pytest.raises(RlvrlabError, match="cannot be read"):
        testbed.load(tmp_path / "nope.md")
