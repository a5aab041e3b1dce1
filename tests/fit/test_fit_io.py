"""What fit reads (card, Hugging Face config.json, torchtitan TOML) and writes (suite scenario, torchtitan TOML)."""

from __future__ import annotations

import json
import tomllib

import pytest

from pytest_flashckpt.config.errors import InputError
from pytest_flashckpt.config.layout import PipelineSchedule
from pytest_flashckpt.config.suites import load_suite
from pytest_flashckpt.fit.candidates import Candidate
from pytest_flashckpt.fit.model_input import read_model
from pytest_flashckpt.fit.writers import torchtitan_toml, write_scenario, write_torchtitan

FSDP = Candidate(gpus=8, dp_shard=8, tp=1, microbatch=2, accumulation=4, strategy="selective_op", precision="mixed")
TWO_D = Candidate(gpus=64, dp_shard=8, tp=8, microbatch=1, accumulation=2, strategy="full", precision="mixed",
                  reshard_after_forward=False)

TITAN = """
[model]
name = "llama3"
flavor = "70B"
[training]
seq_len = 8192
local_batch_size = 2
mixed_precision_param = "bfloat16"
[parallelism]
data_parallel_shard_degree = 8
tensor_parallel_degree = 8
[activation_checkpoint]
mode = "selective"
selective_ac_option = "2"
"""


def test_the_written_scenario_loads_in_the_suite_loader(tmp_path) -> None:
    written = write_scenario(tmp_path / "chosen.yaml", "llama3-8b", FSDP, 8192, "test")
    (scenario,) = load_suite(str(written.path)).scenarios
    assert (scenario.card, scenario.seq_len, scenario.batch_size) == ("llama3-8b", 8192, 2 * 8)
    assert scenario.activation.strategy == "selective_op" and scenario.precision == "mixed"
    assert scenario.simulate.enabled and scenario.simulate.world_size == 8


def test_a_tensor_parallel_scenario_loads_with_its_layout_in_the_axis(tmp_path) -> None:
    written = write_scenario(tmp_path / "chosen.yaml", "llama3-70b", TWO_D, 8192, "test")
    (scenario,) = load_suite(str(written.path)).scenarios
    text = written.path.read_text(encoding="utf-8")
    assert written.layout_in_axis and "layout:" in text  # the suite's layout axis takes tp
    assert scenario.layout.ranks(scenario.simulate.world_size) == (8, 8) and scenario.simulate.world_size == 64
    assert scenario.batch_size == 8  # the data-parallel group's rows; tensor-parallel ranks read the same rows
    assert [p.name for p in tmp_path.iterdir()] == ["chosen.yaml"]  # no staging folder left behind


def test_a_context_parallel_scenario_loads_with_cp_in_the_layout_axis(tmp_path) -> None:
    ringed = Candidate(gpus=128, dp_shard=2, tp=8, microbatch=1, accumulation=8, strategy="full", precision="mixed",
                       cp=8)
    written = write_scenario(tmp_path / "chosen.yaml", "llama3.1-405b", ringed, 131072, "test")
    (scenario,) = load_suite(str(written.path)).scenarios
    assert written.layout_in_axis and scenario.simulate.world_size == 128
    assert scenario.parallel_layout.describe() == "dp_shard 2 x tp 8 x cp 8" and scenario.batch_size == 2


def test_an_hsdp_scenario_loads_with_its_replicas_in_the_layout_axis(tmp_path) -> None:
    hsdp = Candidate(gpus=64, dp_shard=4, tp=8, microbatch=1, accumulation=2, strategy="full", precision="mixed",
                     dp_replicate=2)
    written = write_scenario(tmp_path / "chosen.yaml", "llama3-70b", hsdp, 8192, "test")
    (scenario,) = load_suite(str(written.path)).scenarios
    assert written.layout_in_axis and "# HSDP" not in written.path.read_text(encoding="utf-8")
    assert scenario.parallel_layout.describe() == "dp_replicate 2 x dp_shard 4 x tp 8"
    assert scenario.simulate.world_size == 64 and scenario.batch_size == 8  # every data-parallel rank's row
    # with stages: every axis in the layout axis, the pipeline's batch its microbatches' rows on every replica
    staged = Candidate(**{**vars(hsdp), "tp": 4, "pp": 2, "accumulation": 4, "schedule": "interleaved_1f1b",
                          "stages_per_rank": 2})
    (piped,) = load_suite(str(write_scenario(tmp_path / "staged.yaml", "llama3-70b", staged, 8192, "test").path)).scenarios
    assert piped.parallel_layout.describe() == "dp_replicate 2 x dp_shard 4 x tp 4 x pp 2"
    assert piped.layout.pipeline_schedule() == PipelineSchedule("interleaved_1f1b", 4, 2)
    assert piped.simulate.world_size == 64 and piped.batch_size == 1 * 4 * 8
    # with cp: replicas of the ring's group
    ringed = Candidate(**{**vars(hsdp), "tp": 4, "cp": 2})
    (ring,) = load_suite(str(write_scenario(tmp_path / "ring.yaml", "llama3-70b", ringed, 8192, "test").path)).scenarios
    assert ring.parallel_layout.describe() == "dp_replicate 2 x dp_shard 4 x tp 4 x cp 2" and ring.batch_size == 8


def test_a_scenario_the_loader_refuses_is_not_left_behind(tmp_path) -> None:
    with pytest.raises(InputError, match="the scenario does not load"):
        write_scenario(tmp_path / "bad.yaml", "llama3-8b", Candidate(**{**vars(FSDP), "strategy": "bogus"}), 8192, "test")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(InputError, match="ends in .yaml"):
        write_scenario(tmp_path / "bad.txt", "llama3-8b", FSDP, 8192, "test")


def test_the_torchtitan_toml_reads_back_as_the_same_layout(tmp_path) -> None:
    path = write_torchtitan(tmp_path / "chosen.toml", torchtitan_toml("llama3-70b", TWO_D, 8192, "test", 100))
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    assert data["parallelism"]["data_parallel_shard_degree"] == 8 and data["parallelism"]["tensor_parallel_degree"] == 8
    assert data["parallelism"]["fsdp_reshard_after_forward"] == "never"
    assert data["training"] == {"seq_len": 8192, "local_batch_size": 1, "global_batch_size": 16,
                                "mixed_precision_param": "bfloat16", "mixed_precision_reduce": "float32"}
    assert data["activation_checkpoint"] == {"mode": "full"} and data["checkpoint"]["interval"] == 100
    back = read_model(str(path))
    assert back.card.name == "llama3-70b"
    assert back.settings == {"seq_len": 8192, "tp": 8, "gpus": 64, "global_batch_tokens": 16 * 8192,
                             "precision": "mixed", "strategy": "full"}


def test_a_pipeline_layout_reads_back_from_its_torchtitan_toml(tmp_path) -> None:
    staged = Candidate(gpus=64, dp_shard=8, tp=1, microbatch=1, accumulation=16, strategy="full", precision="mixed",
                       reshard_after_forward=False, pp=8, schedule="interleaved_1f1b", stages_per_rank=2)
    path = write_torchtitan(tmp_path / "pp.toml", torchtitan_toml("llama3-70b", staged, 8192, "test", 10))
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    assert data["parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert data["parallelism"]["pipeline_parallel_microbatch_size"] == 1 and data["training"]["local_batch_size"] == 16
    back = read_model(str(path)).settings
    assert (back["pp"], back["schedule"], back["gpus"], back["global_batch_tokens"]) == (8, "interleaved_1f1b", 64, 128 * 8192)


def test_a_context_parallel_layout_with_hsdp_reads_back_from_its_torchtitan_toml(tmp_path) -> None:
    """What fit writes, fit reads back: the 128K layouts it chooses compose cp with FSDP, HSDP and tp (the reader
    refused cp beside any other degree until the search composed them)."""
    ringed = Candidate(gpus=256, dp_shard=2, tp=8, microbatch=1, accumulation=4, strategy="full", precision="mixed",
                       cp=8, dp_replicate=2)
    path = write_torchtitan(tmp_path / "cp.toml", torchtitan_toml("llama3.1-405b", ringed, 131072, "test", 10))
    back = read_model(str(path)).settings
    assert (back["cp"], back["tp"], back["gpus"], back["global_batch_tokens"]) == (8, 8, 256, 4 * 4 * 131072)


def test_a_torchtitan_toml_is_mapped_where_it_can_be_and_refused_where_not(tmp_path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(TITAN, encoding="utf-8")
    model = read_model(str(path))
    assert model.card.name == "llama3-70b"
    assert model.settings == {"seq_len": 8192, "tp": 8, "gpus": 64, "global_batch_tokens": 2 * 8 * 8192,
                              "precision": "mixed", "strategy": "every_k", "k": 2}
    path.write_text(TITAN.replace("tensor_parallel_degree = 8", 'pipeline_parallel_degree = 4\n'
                                  'pipeline_parallel_schedule = "Interleaved1F1B"'), encoding="utf-8")
    piped = read_model(str(path)).settings
    assert (piped["pp"], piped["schedule"], piped["gpus"]) == (4, "interleaved_1f1b", 32)
    path.write_text(TITAN.replace("tensor_parallel_degree = 8", "context_parallel_degree = 4\npipeline_parallel_degree = 2"),
                    encoding="utf-8")  # cp inside pipeline stages (Llama 3's 128K layout): fit searches it
    both = read_model(str(path)).settings
    assert (both["cp"], both["pp"], both["gpus"]) == (4, 2, 64)
    for bad, match in (
        (TITAN.replace('"70B"', '"debugmodel"'), r"\[model\] name 'llama3' flavor 'debugmodel' has no card here"),
        (TITAN.replace("tensor_parallel_degree = 8", 'pipeline_parallel_degree = 4\npipeline_parallel_schedule = "ZeroBubble"'),
         r"pipeline_parallel_schedule = 'ZeroBubble': fit simulates 1F1B"),
        (TITAN.replace('flavor = "70B"', 'flavor = "70B"\nconverters = ["float8"]'), r"converters \['float8'\]: float8"),
        (TITAN.replace('mode = "selective"', 'mode = "sometimes"'), r"mode = 'sometimes': expected one of none, full, selective"),
        ("[model\n", "not valid TOML"),
    ):
        path.write_text(bad, encoding="utf-8")
        with pytest.raises(InputError, match=match):
            read_model(str(path))


def test_a_hugging_face_llama_config_becomes_a_llama_card(tmp_path) -> None:
    config = {"model_type": "llama", "vocab_size": 2048, "num_hidden_layers": 3, "num_attention_heads": 6,
              "num_key_value_heads": 2, "hidden_size": 192, "intermediate_size": 520, "max_position_embeddings": 2048,
              "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
    path = tmp_path / "tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config), encoding="utf-8")
    card = read_model(str(path)).card
    assert card.num_params() == read_model("llama-tiny").card.num_params() and card.name == "tiny"
    path.write_text(json.dumps({**config, "model_type": "gpt2"}), encoding="utf-8")
    with pytest.raises(InputError, match="model_type 'gpt2': fit maps Llama configs only"):
        read_model(str(path))
    with pytest.raises(InputError, match="unknown model card 'no-such-card'"):
        read_model("no-such-card")
