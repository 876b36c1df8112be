"""Training: the bundled models' data, runs, evaluation and model cards, and training in class, apart from the engine.

    python -m tformer_train.train vit-tiny --out /tmp/vit      # or the `tformer-train` script

train (the bundled models' reproducible runs, the command line), data (the generated toy languages and
shape scenes), corpora (the shipped data sets: movie snippets, digits), evaluation (what the model cards
report), cards (the model cards, from the recorded figures), early_attention (the sentiment and RNN
models), mae_tiny and detr_tiny (the masked autoencoder and the DETR), boxes (their box maths), and
classroom (the Train page's training in class: a small text classifier and a tiny ViT, per seed).

Built on `tformer_core` (the models, their loading from assets/); the core never imports this package, so a
notebook that only reads models loads none of it.
"""
