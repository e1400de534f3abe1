"""Export a trained Swin-B checkpoint to TorchScript and ONNX for serving."""
import argparse
import logging
import os

import timm
import torch

log = logging.getLogger("export")


def strip_prefixes(state_dict, prefixes=("module.", "model.", "_orig_mod.")):
    cleaned = {}
    for k, v in state_dict.items():
        for p in prefixes:
            if k.startswith(p):
                k = k[len(p):]
        cleaned[k] = v
    return cleaned


def load_weights(model, path, use_ema):
    checkpoint = torch.load(path, map_location="cpu")
    key = "state_dict_ema" if use_ema and "state_dict_ema" in checkpoint else "state_dict"
    missing, unexpected = model.load_state_dict(strip_prefixes(checkpoint[key]), strict=False)
    log.info("loaded %s from %s (missing=%d, unexpected=%d)", key, path, len(missing), len(unexpected))
    return checkpoint.get("epoch", -1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="swin_base_patch4_window12_384")
    parser.add_argument("--checkpoint", default="output/train/swin_base_384/model_best.pth.tar")
    parser.add_argument("--num_classes", type=int, default=21843)
    parser.add_argument("--use_ema", action="store_true")
    parser.add_argument("--out_dir", default="export")
    parser.add_argument("--opset", type=int, default=17)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    model = timm.create_model(args.arch, pretrained=False, num_classes=args.num_classes)
    epoch = load_weights(model, args.checkpoint, args.use_ema)
    device = torch.device("cuda")
    model = model.to(device).eval()

    example = torch.randn(1, 3, 384, 384, device=device)
    os.makedirs(args.out_dir, exist_ok=True)
    with torch.no_grad():
        traced = torch.jit.trace(model, example)
        traced.save(os.path.join(args.out_dir, f"{args.arch}_ep{epoch}.ts"))
        ref = model(example)
        diff = (traced(example) - ref).abs().max().item()
        log.info("torchscript max abs diff: %.2e", diff)
        torch.onnx.export(model, example, os.path.join(args.out_dir, f"{args.arch}_ep{epoch}.onnx"),
                          opset_version=args.opset, input_names=["pixel_values"], output_names=["logits"],
                          dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}})
    log.info("exported to %s", args.out_dir)


if __name__ == "__main__":
    main()
