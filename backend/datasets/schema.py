"""The schema of the dataset requests beyond single fields (drf-spectacular extensions).

What a request alone gets wrong is a 400 the schema predicts: the epsilon cap above 0 and at
most the chain's cap, delta strictly between 0 and 1, a CSV's label column, a grantee's address.
What a file holds (a parseable CSV or NPZ, its label column, delta <= 1/(10 n) for its records)
no schema can state: its 400 names the field.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiSerializerExtension

from fl_node.job.limits import MAX_EPSILON_CAP

ADDRESS_PATTERN = "^0x[0-9a-fA-F]{40}$"


class DatasetUploadSchema(OpenApiSerializerExtension):
    target_class = "backend.datasets.serializers.DatasetUploadSerializer"

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_basic_serializer(self.target, direction)
        if direction != "request":
            return schema
        properties = dict(schema["properties"])
        properties["epsilon_cap"] = {
            **properties["epsilon_cap"],
            "exclusiveMinimum": True,
            "maximum": MAX_EPSILON_CAP,
        }
        properties["delta"] = {**properties["delta"], "exclusiveMinimum": True, "exclusiveMaximum": True}
        # NPZ, or a label column (a pattern, not an enum: the enum names of the schema stay one a field)
        csv_needs_a_label = [
            {"type": "object", "properties": {"format": {"type": "string", "pattern": "^npz$"}}},
            {"type": "object", "required": ["label_column"]},
        ]
        return {**schema, "properties": properties, "anyOf": csv_needs_a_label}


class GrantRequestSchema(OpenApiSerializerExtension):
    target_class = "backend.datasets.serializers.GrantRequestSerializer"

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_basic_serializer(self.target, direction)
        node = {**schema["properties"]["node"], "pattern": ADDRESS_PATTERN}
        node.pop("minLength", None)
        return {**schema, "properties": {**schema["properties"], "node": node}}
