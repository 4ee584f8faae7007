"""Who is counted: key specs, the client address behind proxies, hashed and masked subjects."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.test import RequestFactory

from ratelimit_app.operations import SUBJECT_KEY
from ratelimit_app.subjects import KeySpecError, client_ip, parse_key_spec, subject_for


def request(ip="203.0.113.7", user=None, path="/", **meta):
    made = RequestFactory().get(path, REMOTE_ADDR=ip, **meta)
    made.user = user or AnonymousUser()
    return made


def subject(spec, made):
    return subject_for(parse_key_spec(spec), made)


# --- key specs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["ip", "user", "user_or_ip", "global", "header:X-Api-Key", "param:username",
                                  "get:page", "post:username", " ip , header:User-Agent "])
def test_valid_key_specs_parse(spec):
    assert parse_key_spec(spec)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "empty"),
        ("usr", "Unknown key kind"),
        ("ip,", "empty part"),
        ("header:", "needs a header name"),
        ("header:X Api", "not a valid HTTP header name"),
        ("param:", "needs a parameter name"),
        ("get:", "needs a parameter name"),
        ("post:", "needs a parameter name"),
        ("ip,ip", "repeats ip"),
        ("global,ip", "cannot be combined"),
    ],
)
def test_bad_key_specs_say_what_is_wrong(spec, message):
    with pytest.raises(KeySpecError, match=message):
        parse_key_spec(spec)


# --- each kind -----------------------------------------------------------------------------------


def test_ip_subject():
    found = subject("ip", request())
    assert found.display == "ip:203.0.113.7"
    # one client, one counter; another client, another; and the key is what the live page resets by
    assert found.key == subject("ip", request()).key != subject("ip", request(ip="203.0.113.8")).key
    assert SUBJECT_KEY.fullmatch(found.key)


def test_user_subject_and_anonymous_has_none():
    assert subject("user", request()) is None
    assert subject("user", request(user=User(pk=42))).display == "user:42"


@pytest.mark.django_db
def test_a_user_subject_is_shown_by_username_and_counted_by_id():
    from ratelimit_app.subjects import subject_from_text

    alice = subject("user", request(user=User(pk=42, username="alice")))
    assert alice.display == "user:alice"
    assert alice.key == subject("user", request(user=User(pk=42, username="renamed"))).key
    assert alice.key == subject_from_text(parse_key_spec("user"), "user:42").key
    # a name that would read as another user's id, or as two parts of a composite key: the id
    assert subject("user", request(user=User(pk=42, username="7"))).display == "user:42"
    assert subject("user", request(user=User(pk=42, username="a,b"))).display == "user:42"
    assert subject("user_or_ip", request(user=User(pk=42, username="alice"))).display == "user:alice"
    both = subject("ip,user", request(user=User(pk=42, username="alice")))
    assert both.display == "ip:203.0.113.7, user:alice"
    assert both.key == subject_from_text(parse_key_spec("ip,user"), "ip:203.0.113.7, user:42").key


def test_user_or_ip():
    assert subject("user_or_ip", request()).display == "ip:203.0.113.7"
    assert subject("user_or_ip", request(user=User(pk=42))).display == "user:42"


def test_header_subject_is_masked_and_missing_header_gives_none():
    found = subject("header:X-Api-Key", request(HTTP_X_API_KEY="sk_live_abcdef123456"))
    assert found.display == "header:X-Api-Key=…3456"
    assert subject("header:X-Api-Key", request()) is None
    assert subject("header:X-Api-Key", request(HTTP_X_API_KEY="")) is None


def test_plain_headers_are_shown(settings):
    assert subject("header:User-Agent", request(HTTP_USER_AGENT="curl/8.0")).display == "header:User-Agent=curl/8.0"
    settings.RATELIMIT_PLAIN_HEADERS = ()
    assert subject("header:User-Agent", request(HTTP_USER_AGENT="curl/8.0")).display == "header:User-Agent=…"


def post(body, content_type, path="/"):
    made = RequestFactory().post(path, body, content_type=content_type, REMOTE_ADDR="1.2.3.4")
    made.user = AnonymousUser()
    return made


def test_param_reads_the_form_body_then_a_json_field_then_the_query_string():
    assert subject("param:q", request(path="/?q=apple")).display.startswith("param:q=")
    decoy = post("username=alice", "application/x-www-form-urlencoded", path="/?username=decoy")
    assert subject("param:username", decoy) == subject("param:username", post("username=alice", "application/x-www-form-urlencoded"))
    as_json = post({"username": "alice"}, "application/json", path="/?username=decoy")
    assert subject("param:username", as_json) == subject("param:username", decoy)
    assert subject("param:username", post({"other": 1}, "application/json", path="/?username=alice")) == subject("param:username", decoy)


def test_get_and_post_kinds_read_one_source_each():
    both = post("username=alice", "application/x-www-form-urlencoded", path="/?username=bob")
    assert subject("get:username", both) != subject("post:username", both)
    assert subject("get:username", both) == subject("get:username", request(path="/?username=bob"))
    assert subject("post:username", request(path="/?username=bob")) is None
    assert subject("post:username", post({"username": "alice"}, "application/json")) == subject("post:username", both)


def test_reading_the_body_leaves_it_to_the_view():
    alice = subject("param:username", request(path="/?username=alice"))
    form = post("username=alice", "application/x-www-form-urlencoded")
    assert subject("param:username", form) == alice
    assert form.body == b"username=alice" and form.POST["username"] == "alice"
    multipart = RequestFactory().post("/", {"username": "alice"}, REMOTE_ADDR="1.2.3.4")
    assert subject("param:username", multipart) == alice
    assert b'name="username"' in multipart.body and multipart.POST["username"] == "alice"
    as_json = post({"username": "alice"}, "application/json")
    assert subject("param:username", as_json) == alice
    assert as_json.body == b'{"username": "alice"}'


def test_json_values_that_are_not_strings_still_count():
    assert subject("param:id", post({"id": 7}, "application/json")) == subject("param:id", request(path="/?id=7"))
    as_list = subject("param:id", post({"id": ["a", "b"]}, "application/json"))
    assert as_list == subject("param:id", request(path="/?id=" + quote('["a","b"]')))  # the value as compact JSON
    assert as_list != subject("param:id", post({"id": ["b", "a"]}, "application/json"))
    assert subject("param:id", post({"id": None}, "application/json")) is None


def test_a_malformed_multipart_body_gives_no_subject_and_the_view_still_sees_the_error():
    from django.http.multipartparser import MultiPartParserError

    broken = post("--xyz\r\nContent-Disposition: form-data\r\n\r\nnope", "multipart/form-data; boundary=xyz")
    broken.META["CONTENT_TYPE"] = "multipart/form-data"  # no boundary: Django refuses to parse it
    broken._set_content_type_params(broken.META)
    assert subject("param:username", broken) is None
    with pytest.raises(MultiPartParserError):
        broken.POST  # as if the subject had never been computed: Django answers 400


def test_a_body_over_django_limits_gives_no_subject(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10
    assert subject("param:username", post("username=" + "a" * 100, "application/x-www-form-urlencoded")) is None
    assert subject("param:username", post({"username": "a" * 100}, "application/json")) is None


def test_global_subject_is_everyone():
    assert subject("global", request("198.51.100.1")) == subject("global", request("198.51.100.2"))


def test_composite_needs_every_part():
    both = subject("ip,header:User-Agent", request(HTTP_USER_AGENT="curl"))
    assert both.display == "ip:203.0.113.7, header:User-Agent=curl"
    assert subject("ip,header:User-Agent", request()) is None
    assert both != subject("ip,header:User-Agent", request(HTTP_USER_AGENT="wget"))


def test_kinds_never_share_a_key():
    by_ip = subject("ip", request("1.2.3.4"))
    by_header = subject("header:X-Real", request(HTTP_X_REAL="1.2.3.4"))
    assert by_ip.key != by_header.key


def test_subjects_are_stable():
    assert subject("ip", request()).key == subject("ip", request()).key


def test_huge_and_odd_values_stay_bounded():
    found = subject("header:X-Api-Key", request(HTTP_X_API_KEY="x" * 10_240))
    assert len(found.key) == 16 and len(found.display) <= 100
    odd = subject("header:User-Agent", request(HTTP_USER_AGENT="\xff\xfe\x00\x1b[31m" + "y" * 300))
    assert len(odd.display) <= 100 and "\x00" not in odd.display and "\x1b" not in odd.display


# --- the client's address ------------------------------------------------------------------------


def test_forwarded_for_from_an_untrusted_client_is_ignored():
    assert client_ip(request(HTTP_X_FORWARDED_FOR="198.51.100.1")) == "203.0.113.7"


def test_one_trusted_proxy(settings):
    settings.RATELIMIT_TRUSTED_PROXIES = ["10.0.0.1"]
    assert client_ip(request("10.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.1")) == "198.51.100.1"


def test_right_most_untrusted_address_behind_two_proxies(settings):
    settings.RATELIMIT_TRUSTED_PROXIES = ["10.0.0.0/8"]
    chain = "6.6.6.6, 198.51.100.1, 10.0.0.2"  # the client prepended a lie; the proxies appended the truth
    assert client_ip(request("10.0.0.1", HTTP_X_FORWARDED_FOR=chain)) == "198.51.100.1"


def test_all_trusted_chain_uses_the_left_most(settings):
    settings.RATELIMIT_TRUSTED_PROXIES = ["10.0.0.0/8"]
    assert client_ip(request("10.0.0.1", HTTP_X_FORWARDED_FOR="10.1.1.1, 10.0.0.2")) == "10.1.1.1"


def test_garbage_in_the_chain_counts_against_the_proxy(settings):
    settings.RATELIMIT_TRUSTED_PROXIES = ["10.0.0.0/8"]
    assert client_ip(request("10.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.1, bogus, 10.0.0.2")) == "10.0.0.2"


def test_ports_and_brackets_in_forwarded_entries(settings):
    settings.RATELIMIT_TRUSTED_PROXIES = ["10.0.0.1"]
    assert client_ip(request("10.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.1:5678")) == "198.51.100.1"
    assert client_ip(request("10.0.0.1", HTTP_X_FORWARDED_FOR="[2001:db8::1]:443")) == "2001:db8::/64"


def test_ipv6_is_grouped_by_prefix(settings):
    assert client_ip(request("2001:db8:1:2::1")) == client_ip(request("2001:db8:1:2:ffff::9")) == "2001:db8:1:2::/64"
    assert client_ip(request("2001:db8:1:3::1")) == "2001:db8:1:3::/64"
    settings.RATELIMIT_IPV6_PREFIX = 128
    assert client_ip(request("2001:db8:1:2::1")) == "2001:db8:1:2::1"


def test_ipv4_mapped_addresses_count_as_ipv4():
    assert client_ip(request("::ffff:203.0.113.7")) == "203.0.113.7"


def test_unparsable_remote_addr_means_no_ip_subject():
    assert subject("ip", request("not-an-ip")) is None


def test_ipv6_zone_ids_are_not_new_subjects(settings):
    settings.RATELIMIT_IPV6_PREFIX = 128
    assert client_ip(request("2001:db8::77%1")) == client_ip(request("2001:db8::77%2")) == "2001:db8::77"
    settings.RATELIMIT_TRUSTED_PROXIES = ["10.0.0.1"]
    assert client_ip(request("10.0.0.1", HTTP_X_FORWARDED_FOR="[fe80::1%eth0]:443")) == "fe80::1"


def test_behind_a_unix_socket_the_forwarded_address_counts_when_unix_is_trusted(settings):
    assert client_ip(request("", HTTP_X_FORWARDED_FOR="198.51.100.1")) is None
    settings.RATELIMIT_TRUSTED_PROXIES = ["unix"]
    assert client_ip(request("", HTTP_X_FORWARDED_FOR="198.51.100.1")) == "198.51.100.1"
    assert client_ip(request("", HTTP_X_FORWARDED_FOR="6.6.6.6, 198.51.100.1")) == "198.51.100.1"
    assert client_ip(request("", HTTP_X_FORWARDED_FOR="")) is None
    assert client_ip(request("203.0.113.7", HTTP_X_FORWARDED_FOR="198.51.100.1")) == "203.0.113.7"  # TCP: untrusted


def test_unix_and_networks_together(settings):
    settings.RATELIMIT_TRUSTED_PROXIES = ["unix", "10.0.0.0/8"]
    assert client_ip(request("", HTTP_X_FORWARDED_FOR="198.51.100.1, 10.0.0.2")) == "198.51.100.1"


@pytest.mark.django_db
def test_a_trusted_proxy_entry_that_is_not_an_address_is_a_system_check_error(settings):
    from django.core.checks import run_checks

    settings.RATELIMIT_TRUSTED_PROXIES = ["unix", "10.0.0.0/8"]
    assert "ratelimit_app.E003" not in [message.id for message in run_checks()]
    settings.RATELIMIT_TRUSTED_PROXIES = ["unix", "localhost", "10.0.0.0/8"]
    assert "ratelimit_app.E003" in [message.id for message in run_checks()]
    assert client_ip(request("10.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.1")) == "198.51.100.1"  # still works


@pytest.mark.django_db
def test_a_bad_trusted_proxy_entry_stops_migrate_and_says_so_not_that_it_is_ignored(settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.RATELIMIT_TRUSTED_PROXIES = ["localhost"]
    with pytest.raises(SystemCheckError) as stopped:
        call_command("migrate", verbosity=0, skip_checks=False)
    said = str(stopped.value)
    assert "ratelimit_app.E003" in said and "migrate and runserver stop until it is fixed" in said
    guide = (Path(__file__).parent.parent / "docs" / "howto" / "proxies.md").read_text()
    assert "`migrate` and `runserver` stop until it is fixed" in guide and "E003`) and ignored" not in guide


def test_a_drf_view_still_parses_a_body_read_for_the_subject():
    from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
    from rest_framework.request import Request

    made = [
        post("username=alice", "application/x-www-form-urlencoded"),
        post({"username": "alice"}, "application/json"),
        RequestFactory().post("/", {"username": "alice"}, REMOTE_ADDR="1.2.3.4"),
    ]
    for django_request in made:
        drf_request = Request(django_request, parsers=[JSONParser(), FormParser(), MultiPartParser()])
        assert subject("param:username", drf_request) == subject("param:username", request(path="/?username=alice"))
        assert drf_request.data["username"] == "alice"


def test_a_multipart_upload_larger_than_the_memory_limit_is_streamed_as_the_view_would(settings):
    from django.core.files.uploadedfile import SimpleUploadedFile

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000  # the file does not count, as in Django
    upload = SimpleUploadedFile("report.csv", b"x" * 50_000)
    made = RequestFactory().post("/", {"username": "alice", "report": upload}, REMOTE_ADDR="1.2.3.4")
    assert subject("param:username", made) == subject("param:username", post("username=alice", "application/x-www-form-urlencoded"))
    assert made.POST["username"] == "alice" and made.FILES["report"].size == 50_000
