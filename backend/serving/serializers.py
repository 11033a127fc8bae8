from rest_framework import serializers

from backend.serving.models import GlobalModel


class GlobalModelSerializer(serializers.ModelSerializer):
    class Meta:
        model = GlobalModel
        fields = [
            "id",
            "job",
            "round",
            "architecture",
            "input_shape",
            "num_classes",
            "content_hash",
            "onchain_hash",
            "reference",
            "created",
        ]
        read_only_fields = fields


class PredictRequestSerializer(serializers.Serializer):
    inputs = serializers.ListField(
        child=serializers.JSONField(),
        allow_empty=False,
        help_text="samples: flat rows or input-shaped arrays",
    )


class PredictQuerySerializer(serializers.Serializer):
    latest = serializers.BooleanField(
        default=False, help_text="serve the newest version of this model's job (the hot-swapped one)"
    )


class PredictResponseSerializer(serializers.Serializer):
    model = serializers.IntegerField(help_text="id of the version that answered")
    predictions = serializers.ListField(child=serializers.IntegerField())
    probabilities = serializers.ListField(child=serializers.ListField(child=serializers.FloatField()))
