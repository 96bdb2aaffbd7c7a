"""Export stage (GGUF, ONNX, bundles). Installed as `dgpo_edge.export`."""
