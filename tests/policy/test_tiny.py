"""The tiny tier: offline tokenizer + Qwen2 folder, determinism, the cache, and the warm start's success rate."""

import json
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rlvrlab.data.countdown import make_problems, problem_solutions  # noqa: E402
from rlvrlab.policy import tiny  # noqa: E402
from rlvrlab.rewards import countdown  # noqa: E402

SMALL = dict(layers=1, hidden=32, heads=2)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def problems():
    return make_problems(64, seed=0)


def _state(folder: Path) -> dict:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_folder_reloads_offline_through_auto_classes(tmp_path: Path, problems) -> None:
    corpus = tiny.tokenizer_corpus(problems, problem_solutions)
    folder = tiny.build_tiny_model(tmp_path / "m", corpus=corpus, seed=0, **SMALL)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.model_type == "qwen2" and model.config.num_hidden_layers == 1
    assert tok.eos_token == tiny.EOS_TOKEN and tok.pad_token == tiny.PAD_TOKEN
    assert tok.eos_token_id != tok.pad_token_id
    assert tok.padding_side == "left"
    assert 259 <= len(tok) <= tiny.VOCAB_SIZE and model.config.vocab_size == len(tok)
    # The prompt is tokenised as is: no BOS or other special token, and AutoTokenizer (which rebuilds a
    # Qwen2Tokenizer) splits text exactly as the raw tokenizer.json does.
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in corpus[:50] + ["Hello, wörld!\n 12 -> 3"]:
        ids = tok(text)["input_ids"]
        assert ids == raw.encode(text).ids
        assert tok.decode(ids) == text
        assert not set(ids) & set(tok.all_special_ids)
    # Left padding and a ChatML chat template.
    batch = tok([problems[0].prompt, "3 -> 3:"], padding=True, return_tensors="pt")
    assert batch["input_ids"][1, 0].item() == tok.pad_token_id and batch["attention_mask"][1, 0].item() == 0
    chat = tok.apply_chat_template([{"role": "user", "content": "2 3 -> 6:"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\n2 3 -> 6:<|im_end|>\n<|im_start|>assistant\n"
    # Sampling defaults: the raw distribution, no top-k 50.
    gen = model.generation_config
    assert gen.top_k == 0 and gen.top_p == 1.0 and gen.temperature == 1.0 and gen.do_sample
    assert gen.eos_token_id == tok.eos_token_id and gen.pad_token_id == tok.pad_token_id
    out = model.generate(**tok([problems[0].prompt], return_tensors="pt"), max_new_tokens=4)
    assert out.shape[1] <= len(tok(problems[0].prompt)["input_ids"]) + 4


def test_build_is_deterministic(tmp_path: Path, problems) -> None:
    corpus = tiny.tokenizer_corpus(problems, problem_solutions)
    a = tiny.build_tiny_model(tmp_path / "a", corpus=corpus, seed=7, **SMALL)
    b = tiny.build_tiny_model(tmp_path / "b", corpus=corpus, seed=7, **SMALL)
    c = tiny.build_tiny_model(tmp_path / "c", corpus=corpus, seed=8, **SMALL)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    sa, sb, sc = _state(a), _state(b), _state(c)
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_warm_start_is_deterministic_and_lowers_the_loss(tmp_path: Path, problems) -> None:
    corpus = tiny.tokenizer_corpus(problems, problem_solutions)
    a, b, c = (tiny.build_tiny_model(tmp_path / n, corpus=corpus, seed=0, **SMALL) for n in "abc")
    initial = _state(a)
    stats_a = tiny.warm_start(a, problems, steps=30, seed=1, batch_size=8, solutions_fn=problem_solutions)
    stats_b = tiny.warm_start(b, problems, steps=30, seed=1, batch_size=8, solutions_fn=problem_solutions)
    short = tiny.warm_start(c, problems, steps=3, seed=1, batch_size=8, solutions_fn=problem_solutions)
    assert stats_a["loss"] == stats_b["loss"] < short["loss"]
    sa, sb = _state(a), _state(b)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)  # same seed -> same weights
    assert not all(torch.equal(sa[k], initial[k]) for k in sa)  # saved back into the folder


def test_cache_hit_returns_the_same_folder_without_rebuilding(tmp_path: Path, problems, monkeypatch) -> None:
    kwargs = dict(**SMALL, warmstart_steps=2, problems=problems, seed=0, cache_root=tmp_path,
                  solutions_fn=problem_solutions)
    folder = tiny.tiny_model_folder(**kwargs)
    assert folder.parent == tmp_path / "tiny"
    info = json.loads((folder / "rlvrlab_tiny.json").read_text())
    assert info["warmstart_steps"] == 2 and info["version"] == tiny.CODE_VERSION
    assert [p.name for p in (tmp_path / "tiny").iterdir()] == [folder.name]  # no temporary folder left

    def boom(*args, **kwargs):
        raise AssertionError("rebuilt")

    monkeypatch.setattr(tiny, "build_tiny_model", boom)
    start = time.perf_counter()
    assert tiny.tiny_model_folder(**kwargs) == folder
    assert time.perf_counter() - start < 1.0
    # Anything that changes the contents changes the folder.
    with pytest.raises(AssertionError, match="rebuilt"):
        tiny.tiny_model_folder(**{**kwargs, "warmstart_steps": 3})
    with pytest.raises(AssertionError, match="rebuilt"):
        tiny.tiny_model_folder(**{**kwargs, "problems": problems[:-1]})
    # ... and a failed build leaves nothing behind.
    assert [p.name for p in (tmp_path / "tiny").iterdir()] == [folder.name]


def test_crash_during_warm_start_leaves_no_folder(tmp_path: Path, problems, monkeypatch) -> None:
    def crash(*args, **kwargs):
        raise RuntimeError("crash")

    monkeypatch.setattr(tiny, "warm_start", crash)
    with pytest.raises(RuntimeError, match="crash"):
        tiny.tiny_model_folder(**SMALL, warmstart_steps=2, problems=problems, seed=0, cache_root=tmp_path,
                               solutions_fn=problem_solutions)
    assert list((tmp_path / "tiny").iterdir()) == []


@pytest.mark.slow
def test_warm_started_default_model_has_room_to_learn(tmp_path: Path) -> None:
    """Config defaults (4 x 128, 4 heads, 300 steps, 1024 problems, 10% held out): pass@1 in [5%, 80%]."""
    problems = make_problems(1024, seed=0)
    train = problems[: len(problems) - len(problems) // 10]
    start = time.perf_counter()
    folder = tiny.tiny_model_folder(
        layers=4, hidden=128, heads=4, warmstart_steps=300, problems=train, seed=0, cache_root=tmp_path,
        solutions_fn=problem_solutions,
    )
    build_seconds = time.perf_counter() - start
    info = json.loads((folder / "rlvrlab_tiny.json").read_text())
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    model.eval()
    torch.manual_seed(0)
    sample = train[:64]
    enc = tok([p.prompt for p in sample], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=32,
            num_return_sequences=4,
        )
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    rewards = [countdown(t, sample[i // 4].answer).score for i, t in enumerate(texts)]
    pass_at_1 = sum(rewards) / len(rewards)
    print(f"pass@1={pass_at_1:.3f} build+warm start {build_seconds:.1f}s, warm start {info['warmstart']}")
    assert 0.05 <= pass_at_1 <= 0.80
    # Responses are well-formed expressions that end with eos well before the budget.
    ended = (out[:, enc["input_ids"].shape[1] :] == tok.eos_token_id).any(dim=1).float().mean().item()
    assert ended > 0.9
