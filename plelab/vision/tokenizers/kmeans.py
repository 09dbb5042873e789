"""Tokenizers that cluster a fixed descriptor of each patch with k-means: the id is the nearest centroid."""

from __future__ import annotations

import numpy as np

from plelab.vision.tokenizers.base import TokenizerError, VisualTokenizer, vision_import


class KMeansTokenizer(VisualTokenizer):
    """`sklearn.cluster.MiniBatchKMeans(n_clusters=K, random_state=seed)` on per-patch descriptors.

    Subclasses define `_descriptors(images) -> (N, P, D) float32`; ids are the nearest centroid
    (`sklearn.metrics.pairwise_distances_argmin`), so encoding needs only the saved centroids.
    """

    option_defaults = {"kmeans_batch": 4096, "kmeans_n_init": 3}

    def __init__(self, codebook: int, patch_size: int = 7, seed: int = 0, **options: int | float) -> None:
        super().__init__(codebook, patch_size, seed, **options)
        self.centroids: np.ndarray | None = None

    def _descriptors(self, images: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _fit(self, images: np.ndarray) -> None:
        cluster = vision_import("sklearn.cluster")

        x = self._descriptors(images)
        x = x.reshape(-1, x.shape[-1]).astype(np.float64)
        if len(x) < self.codebook:
            raise TokenizerError(f"{self.kind}: {len(x)} patches cannot fill a codebook of {self.codebook} clusters")
        km = cluster.MiniBatchKMeans(n_clusters=self.codebook, random_state=self.seed,
                             batch_size=self.options["kmeans_batch"], n_init=self.options["kmeans_n_init"])
        self.centroids = km.fit(x).cluster_centers_.astype(np.float32)

    def _encode(self, images: np.ndarray) -> np.ndarray:
        pairwise_distances_argmin = vision_import("sklearn.metrics").pairwise_distances_argmin

        x = self._descriptors(images)
        n, p, d = x.shape
        if n == 0:
            return np.zeros((0, p), dtype=np.int64)
        return pairwise_distances_argmin(x.reshape(n * p, d), self.centroids).reshape(n, p)

    def _state(self) -> dict[str, np.ndarray]:
        return {"centroids": self.centroids}

    def _restore(self, tensors: dict[str, np.ndarray]) -> None:
        c = tensors.get("centroids")
        if c is None or c.ndim != 2 or c.shape[0] != self.codebook or set(tensors) != {"centroids"}:
            raise TokenizerError(f"{self.kind}: saved weights must be one (K={self.codebook}, D) array 'centroids'")
        self.centroids = c.astype(np.float32)
