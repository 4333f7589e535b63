"""The configuration layer, the bottom one (standard library and YAML only; nothing else of
``fedgo_flwr`` is imported): ``schema`` (typed sections from mappings), ``names`` (the dataset
registry, model and partition names a config accepts), ``yaml_files`` (YAML files, ``base:``
chains, overrides) and ``experiment`` (the core sections and :func:`load_config`).
"""
