"""The catalog: GPU types, node types, regions with offers, and model architectures."""

from coral.catalog.loader import BUILTIN_FILES, DATA_DIR, CatalogError, catalog_to_dict, load_catalog
from coral.catalog.types import GB, Catalog, GpuType, ModelArch, NodeType, Offer, Region

__all__ = [
    "BUILTIN_FILES",
    "DATA_DIR",
    "GB",
    "Catalog",
    "CatalogError",
    "GpuType",
    "ModelArch",
    "NodeType",
    "Offer",
    "Region",
    "catalog_to_dict",
    "load_catalog",
]
