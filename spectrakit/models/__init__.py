"""Models used by the experiments: LLaMA-style LM (`llama`), CNNs (`cnn`), MLPs (`mlp`)."""
