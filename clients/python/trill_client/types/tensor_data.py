"""`from trill_client.types.tensor_data import TensorData`, where Tinker's cookbook imports it."""
from . import TensorData

__all__ = ["TensorData"]
