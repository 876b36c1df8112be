"""Tiny models of every kind, seeded, for the core tests (no network, no files)."""

import torch

import tformer_core as tc

D, H = 16, 4


def _seeded(build, seed=0):
    torch.manual_seed(seed)
    model = build()
    # Random LayerNorm affine parameters too, so a test cannot pass by the identity LN by accident.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.normal_(1.0, 0.2)
                m.bias.normal_(0.0, 0.2)
    return model


def tiny_encoder(norm="post", positional="learned", n_layers=2):
    return _seeded(
        lambda: tc.Encoder(
            tc.EncoderConfig(
                vocab_size=40,
                max_positions=32,
                n_layers=n_layers,
                d_model=D,
                n_heads=H,
                d_ff=32,
                norm=norm,
                positional=positional,
                n_token_types=2,
            )
        )
    )


def tiny_decoder():
    return _seeded(
        lambda: tc.Decoder(tc.DecoderConfig(vocab_size=40, max_positions=32, n_layers=2, d_model=D, n_heads=H, d_ff=32))
    )


def tiny_seq2seq(norm="post"):
    return _seeded(
        lambda: tc.EncoderDecoder(
            tc.Seq2SeqConfig(
                src_vocab_size=30,
                tgt_vocab_size=35,
                max_positions=32,
                n_encoder_layers=2,
                n_decoder_layers=3,
                d_model=D,
                n_heads=H,
                d_ff=32,
                norm=norm,
            )
        )
    )


def tiny_vit(distilled=True):
    return _seeded(
        lambda: tc.ViT(
            tc.ViTConfig(
                image_size=(12, 16),
                patch_size=4,
                n_layers=2,
                d_model=D,
                n_heads=H,
                d_ff=32,
                n_classes=5,
                distilled=distilled,
            )
        )
    )


def image(seed=0, hw=(12, 16)):
    return torch.randn(3, *hw, generator=torch.Generator().manual_seed(seed))
