"""What users give the models: text fitted to a model, image files read safely, images preprocessed."""
