"""Create (or reset) the development login that `make run` prints."""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    """`manage.py create_dev_login`: a staff superuser for local development only."""

    help = "Create the development superuser (DEBUG only)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--username", default="demo")
        parser.add_argument("--password", default="demo")

    def handle(self, *args, username: str, password: str, **options) -> None:
        if not settings.DEBUG:
            raise CommandError(
                "Refusing to create a development login with DEBUG off; "
                "use `manage.py createsuperuser` instead."
            )
        user, created = get_user_model().objects.get_or_create(username=username)
        user.is_staff = True
        user.is_superuser = True
        user.set_password(password)
        user.save()
        verb = "Created" if created else "Reset"
        self.stdout.write(f"{verb} development login: {username} / {password}")
