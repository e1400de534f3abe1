"""facts/evaluation.is_inference_script: a script in which nothing trains."""

from __future__ import annotations

import libcst as cst
import pytest

from oom_lsp.analysis.facts.evaluation import is_inference_script

MAIN = 'if __name__ == "__main__":\n    main()\n'


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("def main():\n    print(model(x))\n" + MAIN, True),
        ("def main():\n    print(model(x))\n" + MAIN.replace('"__main__"', "'__main__'"), True),
        # no script entry: a module a training program may import
        ("def main():\n    print(model(x))\n", False),
        ('if __name__ == "other":\n    main()\n', False),
        # anything that trains
        ("def main():\n    model(x).sum().backward()\n" + MAIN, False),
        ("def main():\n    optimizer.step()\n" + MAIN, False),
        ("def main():\n    trainer.fit(model)\n" + MAIN, False),
        ("def main():\n    model.train()\n" + MAIN, False),
        ("def main():\n    g = torch.autograd.grad(y, x)\n" + MAIN, False),
        ("def main():\n    accelerator.backward(loss)\n" + MAIN, False),
    ],
)
def test_a_script_is_inference_only_when_nothing_in_it_trains(body: str, expected: bool) -> None:
    assert is_inference_script(cst.parse_module(body)) is expected
