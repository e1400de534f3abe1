"""OOM601 no-gradient-checkpointing and OOM602 data-parallel-gather, beyond their examples."""

from __future__ import annotations

import textwrap

import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.findings import Finding
from oom_lsp.analysis.rules.scale import is_large_model_name


def _findings(source: str, code: str) -> list[Finding]:
    return analyze(textwrap.dedent(source), LintSettings(enabled=frozenset({code}), strict=True))


@pytest.mark.parametrize(
    ("name", "large"),
    [
        ("meta-llama/Llama-2-7b-hf", True),
        ("meta-llama/Meta-Llama-3-70B-Instruct", True),
        ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", True),
        ("bigscience/bloom-1b7", True),
        ("EleutherAI/gpt-j-6b", True),
        ("gpt2-xl", True),
        ("bert-large-uncased", True),
        ("google/flan-t5-xxl", True),
        ("huggyllama/llama", True),
        ("/checkpoints/mistral-sft", True),
        ("Qwen/Qwen2-0.5B", False),
        ("EleutherAI/pythia-410m", False),
        ("bigscience/bloom-560m", False),
        ("HuggingFaceTB/SmolLM-135M", False),
        ("gpt2", False),
        ("bert-base-uncased", False),
        ("xlnet-base-cased", False),
        ("distilroberta-base", False),
        ("hf-internal-testing/tiny-random-LlamaForCausalLM", False),
        ("someone/mistral-dummy", False),
        ("org/llama_debug", False),
        ("org/tiny-llama-7b", True),
    ],
)
def test_large_model_names(name: str, large: bool) -> None:
    assert is_large_model_name(name) is large


_HF_TRAINING = """\
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")
EXTRA
opt = torch.optim.AdamW(model.parameters())
for batch in loader:
    model(**batch).loss.backward()
    opt.step()
"""


def test_hf_training_is_reported_with_an_unsafe_fix() -> None:
    [finding] = _findings(_HF_TRAINING.replace("EXTRA\n", ""), "OOM601")
    assert finding.line == 3
    assert finding.fix is not None and not finding.fix.is_safe


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ("model = prepare_model_for_kbit_training(model)", "PEFT enables checkpointing by default"),
        ("# gradient_checkpointing is set in the launcher config", "a mention is enough to stay silent"),
        ("from torch.utils.checkpoint import checkpoint", "torch.utils.checkpoint is used"),
        ("model.requires_grad_(False)", "the model is frozen"),
    ],
)
def test_hf_not_reported(extra: str, why: str) -> None:
    assert _findings(_HF_TRAINING.replace("EXTRA", extra), "OOM601") == [], why


def test_hf_model_only_used_for_inference_next_to_a_trained_one() -> None:
    source = """\
        import torch
        from transformers import AutoModel
        teacher = AutoModel.from_pretrained("meta-llama/Llama-2-7b-hf")
        teacher.eval()
        student = Student()
        opt = torch.optim.AdamW(student.parameters())
        for batch in loader:
            with torch.no_grad():
                target = teacher(**batch).last_hidden_state
            loss = mse(student(batch), target)
            loss.backward()
            opt.step()
        """
    assert _findings(source, "OOM601") == []


def test_eval_then_train_again_is_still_training() -> None:
    source = _HF_TRAINING.replace("EXTRA", "model.eval()\nmodel.train()")
    assert [finding.line for finding in _findings(source, "OOM601")] == [3]


def test_peft_wrapped_model_is_trained() -> None:
    source = """\
        from peft import get_peft_model
        from transformers import AutoModelForCausalLM, Trainer
        base = AutoModelForCausalLM.from_pretrained("tiiuae/falcon-7b")
        model = get_peft_model(base, lora_config)
        Trainer(model=model).train()
        """
    [finding] = _findings(source, "OOM601")
    assert finding.line == 3
    assert "'tiiuae/falcon-7b'" in finding.message
    assert finding.fix is not None and finding.fix.title == "Call `base.gradient_checkpointing_enable()`"


def test_a_module_constant_assigned_twice_is_not_resolved() -> None:
    source = """\
        import torch
        from transformers import AutoModelForCausalLM
        NAME = "meta-llama/Llama-2-7b-hf"
        NAME = "gpt2"
        model = AutoModelForCausalLM.from_pretrained(NAME)
        opt = torch.optim.AdamW(model.parameters())
        model(**batch).loss.backward()
        """
    assert _findings(source, "OOM601") == []


def test_a_parameter_shadowing_the_constant_is_not_resolved() -> None:
    source = """\
        import torch
        from transformers import AutoModelForCausalLM
        NAME = "meta-llama/Llama-2-7b-hf"
        def load(NAME):
            model = AutoModelForCausalLM.from_pretrained(NAME)
            opt = torch.optim.AdamW(model.parameters())
            model(**batch).loss.backward()
        """
    assert _findings(source, "OOM601") == []


def test_a_stack_of_small_modules_is_not_a_deep_model() -> None:
    source = """\
        import torch
        from torch import nn
        heads = nn.ModuleList([nn.Linear(512, 2) for _ in range(16)])
        loss.backward()
        """
    assert _findings(source, "OOM601") == []


def test_a_depth_overridden_below_twelve_is_not_reported() -> None:
    source = """\
        import torch.nn as nn
        class Encoder(nn.Module):
            def __init__(self, depth=24):
                super().__init__()
                self.layers = nn.ModuleList([EncoderLayer() for _ in range(depth)])
        model = Encoder(depth=6)
        model(x).sum().backward()
        """
    assert _findings(source, "OOM601") == []


# --- OOM602 ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "reported"),
    [
        ("import torch.nn as nn\nm = nn.DataParallel(m, [0])\n", False),
        ("import torch.nn as nn\nm = nn.DataParallel(m, [0, 1])\n", True),
        ("import torch.nn as nn\nm = nn.DataParallel(m, device_ids=gpus)\n", True),
        ("from torch.nn import DataParallel as DP\nm = DP(m)\n", True),
        ("import torch\nm = torch.nn.parallel.DataParallel(m)\n", True),
        ("import torch\ny = torch.nn.parallel.data_parallel(m, x, [0])\n", False),
        ("import torch\ny = torch.nn.parallel.data_parallel(m, x)\n", True),
    ],
)
def test_data_parallel(source: str, reported: bool) -> None:
    findings = _findings(source, "OOM602")
    assert bool(findings) is reported
    assert all(finding.fix is None for finding in findings)


_STRATEGY = """\
from torch import nn
class CLASS:
    def setup(self, module, other):
        return nn.DataParallel(WRAPPED)
"""


@pytest.mark.parametrize(
    ("class_name", "wrapped", "reported"),
    [
        ("DataParallelStrategy", "module", False),
        ("DPPlugin", "module", False),
        ("data_parallel_engine", "module=module", False),
        # The class is not named for DataParallel: a trainer choosing it.
        ("Trainer", "module", True),
        ("DistributedDataParallelStrategy", "module", True),
        # Not the module it is handed: the class builds and wraps its own.
        ("DataParallelStrategy", "self.model", True),
        ("DataParallelStrategy", "build(module)", True),
    ],
)
def test_a_data_parallel_strategy_wrapping_what_it_is_given(
    class_name: str, wrapped: str, reported: bool
) -> None:
    source = _STRATEGY.replace("CLASS", class_name).replace("WRAPPED", wrapped)
    assert bool(_findings(source, "OOM602")) is reported


def test_a_function_nested_in_a_strategy_method_is_not_the_method() -> None:
    source = """\
        from torch import nn
        class DataParallelStrategy:
            def setup(self, module):
                def wrap(module):
                    return nn.DataParallel(module)
                return wrap(module)
        """
    assert [finding.line for finding in _findings(source, "OOM602")] == [5]


@pytest.mark.parametrize(
    ("arguments", "reported"),
    [
        ('args = TrainingArguments("out", per_device_train_batch_size=4)', True),
        ("args = TrainingArguments(**config)", False),
        ("(args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()", False),
        ("args = load_arguments()", False),
    ],
)
def test_trainer_arguments_from_elsewhere_may_enable_checkpointing(arguments: str, reported: bool) -> None:
    source = f"""\
        from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments
        model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")
        {arguments}
        Trainer(model=model, args=args, train_dataset=data).train()
        """
    assert bool(_findings(source, "OOM601")) is reported


def test_trainer_arguments_parameter_is_unknown() -> None:
    source = """\
        from transformers import AutoModelForCausalLM, Trainer
        def main(training_args):
            model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")
            Trainer(model, training_args).train()
        """
    assert _findings(source, "OOM601") == []
