"""Models: ``classifiers`` (every classifier by name: :func:`~.classifiers.build_model`),
``mobile`` (MobileNetV3-Small and ShuffleNetV2) and ``features`` (the features that enter a
classifier's output layer, read during a forward pass)."""
