"""Using a trained model: device choice, loading a run or checkpoint for inference, sampling, streaming decode."""
