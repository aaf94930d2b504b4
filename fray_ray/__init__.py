"""fray_ray: the Ray backend (RayCluster)."""
