"""Generated images are served only to the owner of their conversation."""

import pytest
from django.core.files.base import ContentFile

from chat.models import Message, Part

pytestmark = pytest.mark.django_db


def test_only_the_owner_gets_the_image(client, alice, bob, conversation, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    reply = Message.objects.create(conversation=conversation, role="assistant", position=1)
    part = Part.objects.create(message=reply, index=1, kind="image", state="succeeded")
    part.image.save("picture.png", ContentFile(b"\x89PNG fake bytes"))
    url = part.image.url

    client.force_login(bob)
    assert client.get(url).status_code == 404
    client.force_login(alice)
    response = client.get(url)
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"\x89PNG fake bytes"
    client.logout()
    assert client.get(url).status_code == 302  # to the login page
