"""What ``flashckpt fit`` reads the model from: a model card (name or path), a Hugging Face ``config.json`` of a
Llama-type model, or a torchtitan TOML (its ``[model] name/flavor``, ``[training] seq_len / local_batch_size /
global_batch_size``, ``[parallelism]`` degrees and ``[activation_checkpoint] mode``).

A Hugging Face Llama config becomes the project's Llama card (``config.cards.llama.LlamaConfig``) key by key, so the
FLOP closed form (``Family.flop_shape``) and the tensor-parallel plan apply to it as to a shipped card; other model
types are refused (no closed-form FLOPs for them here). A torchtitan TOML is mapped where it can be and refused
where it cannot (an unknown model/flavor, context parallel with another degree, float8 converters), one line naming
the file, the key and the fix.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from pytest_flashckpt.config.cards.llama import LlamaConfig
from pytest_flashckpt.config.errors import ConfigError, InputError
from pytest_flashckpt.config.hf_spec import read_hf_config
from pytest_flashckpt.config.model_card import load_card

# torchtitan's (model name, flavor) -> the project's card of the same model (torchtitan/models/llama3/__init__.py)
TORCHTITAN_MODELS: dict[tuple[str, str], str] = {
    ("llama3", "8B"): "llama3-8b",
    ("llama3", "70B"): "llama3-70b",
    ("llama3", "405B"): "llama3.1-405b",
}
# torchtitan [activation_checkpoint] mode -> the project's strategy ("selective" reads selective_ac_option)
TORCHTITAN_AC = {"none": "none", "full": "full"}
# Hugging Face Llama config key -> LlamaConfig field
HF_LLAMA_KEYS = {
    "vocab_size": "vocab_size", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
    "num_key_value_heads": "n_kv_head", "hidden_size": "n_embd", "intermediate_size": "intermediate_size",
    "max_position_embeddings": "block_size", "rope_theta": "rope_theta", "rms_norm_eps": "norm_eps",
    "tie_word_embeddings": "tie_word_embeddings",
}


@dataclass(frozen=True)
class ModelInput:
    """The card, where it came from, and what a torchtitan TOML also said (``seq_len``, ``global_batch_tokens``,
    ``gpus``, ``tp``, ``strategy``, ``precision``: defaults for the options the command line leaves unset)."""

    card: object
    source: str
    settings: dict = field(default_factory=dict)


def read_model(spec: str) -> ModelInput:
    """``spec``: a ``.toml`` (torchtitan), a ``.json`` (Hugging Face config) or a card name / path."""
    path = Path(spec)
    if spec.endswith(".toml"):
        return read_torchtitan_toml(path)
    if spec.endswith(".json"):
        return ModelInput(hf_llama_card(path), f"Hugging Face config {spec}")
    try:
        return ModelInput(load_card(spec), f"model card {spec}")
    except ConfigError as exc:
        raise InputError(str(exc if exc.where else exc.within("--model"))) from None
    except ValueError as exc:
        raise InputError(f"--model {spec}: {exc}") from None


def hf_llama_card(path: Path) -> LlamaConfig:
    where = f"--model {path}"
    try:
        data = read_hf_config(str(path))
    except ValueError as exc:
        raise InputError(f"{where}: {str(exc).removeprefix('model.hf: ')}") from None
    model_type = data.get("model_type")
    if model_type != "llama":
        raise InputError(f"{where}: model_type {model_type!r}: fit maps Llama configs only (model_type llama: their "
                         "FLOPs and tensor-parallel plan are the llama family's); write a model card for it instead")
    missing = [key for key in HF_LLAMA_KEYS if key not in data and key not in ("tie_word_embeddings", "num_key_value_heads")]
    if missing:
        raise InputError(f"{where}: lacks {', '.join(missing)}; a Llama config.json states them")
    fields = {card_key: data[hf_key] for hf_key, card_key in HF_LLAMA_KEYS.items() if hf_key in data}
    fields.setdefault("n_kv_head", fields["n_head"])
    try:
        return LlamaConfig(name=path.parent.name or path.stem, description=f"from {path}", allocate_on_cpu=False, **fields)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: {exc}") from None


def _section(data: dict, name: str, where: str) -> dict:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise InputError(f"{where}: [{name}] must be a table")
    return value


def _positive(table: dict, key: str, section: str, where: str) -> int | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{where}: [{section}] {key} = {value!r}: expected a positive integer")
    return value


def read_torchtitan_toml(path: Path) -> ModelInput:
    where = f"--model {path}"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{where}: cannot read the file ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{where}: not valid TOML ({exc})") from None
    model = _section(data, "model", where)
    name, flavor = model.get("name"), model.get("flavor")
    if (name, flavor) not in TORCHTITAN_MODELS:
        known = ", ".join(f"{n}/{f}" for n, f in TORCHTITAN_MODELS)
        raise InputError(f"{where}: [model] name {name!r} flavor {flavor!r} has no card here; known: {known}")
    if model.get("converters"):
        raise InputError(f"{where}: [model] converters {model['converters']!r}: float8 / quantized training is not "
                         "modelled by fit (bf16 only); drop converters")
    try:
        card = load_card(TORCHTITAN_MODELS[(name, flavor)])
    except ConfigError as exc:
        raise InputError(f"{where}: [model] {name}/{flavor}: {exc}") from None
    training = _section(data, "training", where)
    settings: dict = {}
    seq = _positive(training, "seq_len", "training", where)
    if seq is not None:
        settings["seq_len"] = seq
    parallelism = _section(data, "parallelism", where)
    degrees = {key: parallelism.get(key, 1) for key in ("data_parallel_replicate_degree", "data_parallel_shard_degree",
                                                        "tensor_parallel_degree", "pipeline_parallel_degree",
                                                        "context_parallel_degree")}
    for key, value in degrees.items():
        if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and not (value == -1 and key == "data_parallel_shard_degree")):
            raise InputError(f"{where}: [parallelism] {key} = {value!r}: expected a positive integer (-1 for the shard degree: the rest)")
    if degrees["tensor_parallel_degree"] > 1:
        settings["tp"] = degrees["tensor_parallel_degree"]
    if degrees["context_parallel_degree"] > 1:
        settings["cp"] = degrees["context_parallel_degree"]
    if degrees["pipeline_parallel_degree"] > 1:
        settings["pp"] = degrees["pipeline_parallel_degree"]
        schedule = parallelism.get("pipeline_parallel_schedule", "1F1B")
        if schedule not in TORCHTITAN_SCHEDULES:
            raise InputError(f"{where}: [parallelism] pipeline_parallel_schedule = {schedule!r}: fit simulates "
                             f"{', '.join(TORCHTITAN_SCHEDULES)}; choose one of them")
        settings["schedule"] = TORCHTITAN_SCHEDULES[schedule]
    dp_known = degrees["data_parallel_shard_degree"] != -1
    if dp_known:
        settings["gpus"] = (degrees["data_parallel_replicate_degree"] * degrees["data_parallel_shard_degree"]
                            * degrees["tensor_parallel_degree"] * degrees["pipeline_parallel_degree"]
                            * degrees["context_parallel_degree"])
    global_batch = _positive(training, "global_batch_size", "training", where)
    local_batch = _positive(training, "local_batch_size", "training", where) or _positive(training, "batch_size", "training", where)
    if global_batch is None and local_batch is not None and dp_known:
        global_batch = local_batch * degrees["data_parallel_replicate_degree"] * degrees["data_parallel_shard_degree"]
    if global_batch is not None and seq is not None:
        settings["global_batch_tokens"] = global_batch * seq
    if training.get("mixed_precision_param", "bfloat16") != "bfloat16":
        raise InputError(f"{where}: [training] mixed_precision_param = {training['mixed_precision_param']!r}: fit "
                         "models bfloat16 compute only; set it to \"bfloat16\"")
    settings["precision"] = "mixed"  # torchtitan's FSDP default: bf16 parameters all-gathered, fp32 reduction
    ac = _section(data, "activation_checkpoint", where)
    mode = ac.get("mode")
    if mode is not None:
        settings.update(_strategy_of(mode, ac.get("selective_ac_option", "op"), where))
    return ModelInput(card, f"torchtitan config {path} ({name}/{flavor})", settings)


TORCHTITAN_SCHEDULES = {"1F1B": "1f1b", "Interleaved1F1B": "interleaved_1f1b", "GPipe": "gpipe"}


def _strategy_of(mode: object, option: object, where: str) -> dict:
    if mode in TORCHTITAN_AC:
        return {"strategy": TORCHTITAN_AC[mode]}
    if mode == "selective":
        if option == "op":
            return {"strategy": "selective_op"}
        if isinstance(option, str) and option.isdigit() and int(option) >= 1:
            return {"strategy": "every_k", "k": int(option)}
        raise InputError(f"{where}: [activation_checkpoint] selective_ac_option = {option!r}: expected \"op\" or a "
                         "positive integer as a string (every k-th block)")
    raise InputError(f"{where}: [activation_checkpoint] mode = {mode!r}: expected one of none, full, selective")
