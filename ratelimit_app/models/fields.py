"""Fields of the app's own: the strategy and the help texts the strategy registry gives, kept out of
migrations (adding a strategy needs none), and a limit in place of a policy's."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.functional import lazy

from .. import strategies

MAX_COST = 2**31 - 1  # what every database stores in an integer column

registry_text = lazy(lambda read, *args: read(*args), str)  # the registry's text, read when shown


def unknown_strategy() -> str:
    return "%(value)s is not a strategy of this site; choose one of " + ", ".join(strategies.STRATEGIES) + "."


class FromRegistry:
    """A field whose help text (and, for the strategy, choices) the registry gives when read. Neither
    changes a column: migrations record the field without them, as Django's own field class."""

    unmigrated = ("help_text",)

    def deconstruct(self):
        name, _path, args, kwargs = super().deconstruct()
        for attribute in self.unmigrated:
            kwargs.pop(attribute, None)
        django_field = next(cls for cls in type(self).__mro__ if cls.__module__.startswith("django.db.models"))
        return name, f"django.db.models.{django_field.__name__}", args, kwargs


class RegistryHelpCharField(FromRegistry, models.CharField):
    pass


class RegistryHelpIntegerField(FromRegistry, models.PositiveIntegerField):
    pass


class StrategyField(FromRegistry, models.CharField):
    """A strategy's name: the registered strategies are its choices and its valid values, read at each
    use, so a strategy added (strategies/<name>.py) is offered and accepted without a migration."""

    unmigrated = ("choices", "help_text")

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("max_length", 20)
        kwargs.setdefault("default", strategies.DEFAULT)
        kwargs.setdefault("help_text", registry_text(strategies.help_text))
        kwargs["choices"] = strategies.choices  # a callable: Django calls it at each use
        super().__init__(*args, **kwargs)

    def validate(self, value, model_instance) -> None:
        if value not in self.empty_values and value not in strategies.STRATEGIES:
            raise ValidationError(unknown_strategy(), code="invalid_choice", params={"value": value})
        super().validate(value, model_instance)

    def formfield(self, **kwargs):
        messages = {"invalid_choice": registry_text(unknown_strategy)}
        return super().formfield(**{"error_messages": messages, **kwargs})


class LimitField(models.PositiveIntegerField):
    """A limit in place of a policy's: blank when exempt, else from 1 to what every database stores;
    its form field says so in those words."""

    MIN_MESSAGE = "The limit must be at least 1 request per window."
    MAX_MESSAGE = f"The limit can be at most {MAX_COST} per window."
    default_validators = [MinValueValidator(1, MIN_MESSAGE), MaxValueValidator(MAX_COST, MAX_MESSAGE)]

    def formfield(self, **kwargs):
        messages = {"min_value": self.MIN_MESSAGE, "max_value": self.MAX_MESSAGE}
        return super().formfield(**{"min_value": 1, "max_value": MAX_COST, "error_messages": messages, **kwargs})


def limit_field(help_text: str) -> LimitField:
    return LimitField("limit", null=True, blank=True, help_text=help_text)
