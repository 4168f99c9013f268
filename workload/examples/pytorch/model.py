"""The PyTorch model of the example server: transformers' YolosForObjectDetection in the
reference study's yolos-small shape, with random weights.

Shape: hidden 384, 12 layers, 6 heads, MLP 1536, 100 detection tokens, 91 classes,
800x1066 input, position embeddings at the input only (as hustvl/yolos-small and
gpushare-workload's yolos-small). `make bench-peer` times the same model.
"""

import torch
from transformers import YolosConfig, YolosForObjectDetection

PRECISIONS = ("fp32", "tf32", "bf16")


def build(precision: str, device: str = "cuda"):
    """Returns (model, pixels, config): the model in eval mode on `device` in
    `precision`, and one batch-1 input of random pixels."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    config = YolosConfig(
        hidden_size=384,
        num_hidden_layers=12,
        num_attention_heads=6,
        intermediate_size=1536,
        image_size=[800, 1066],
        num_detection_tokens=100,
        num_labels=91,
        use_mid_position_embeddings=False,
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = YolosForObjectDetection(config).to(device=device, dtype=dtype).eval()
    pixels = torch.randn(1, 3, 800, 1066, device=device, dtype=dtype)
    return model, pixels, config


def infer(model, pixels) -> None:
    """One inference as a server runs it: forward pass, the result copied to the host
    (which waits for the GPU)."""
    with torch.inference_mode():
        out = model(pixel_values=pixels)
        out.logits.float().cpu()
        out.pred_boxes.float().cpu()
