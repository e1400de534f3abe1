"""The fact engine: what the rules know about a file's values, computed once
per file and queried by the rules (issue 27).

Each module answers one family of questions over the libcst tree the
analyzer already parsed, lazily and cached per `FileContext` (a weak map, as
the other per-file facts are):

- `bindings`: where each name, attribute and argparse option of the file is
  bound, and which binding reaches a given use (a statement-level index);
- `sizes`: the integers, tensors and models the code builds, with the
  evidence for each figure (`int_value`, `tensor_size`, `model_size`);
- `memory`: the bytes a model's training state and a transformer's
  activations take, from the sizes (published formulas, cited);
- `known_models`: parameter counts of pretrained checkpoints and library
  architectures, measured by `bench/known_models_table.py`.

Nothing here imports torch: `oom-lsp check` stays torch-free and fast.
"""
