"""The README's policy reference is a policy the CLI accepts, and its CLI synopsis names the real subcommands."""

import re

import yaml

from kata_sizing.cli import build_parser
from kata_sizing.core.model import parse_policy
from kata_sizing.core.sizing import size_policy
from tests.support.paths import ROOT

README = (ROOT / "README.md").read_text()


def test_the_policy_reference_example_is_valid():
    section = README[README.index("## The policy"):]
    example = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    sizing = size_policy(parse_policy(yaml.safe_load(example)))
    assert sizing.errors == []
    assert [c.runtime_class for c in sizing.classes] == ["kata-qemu-rs-s"]


def test_the_cli_synopsis_lists_every_subcommand():
    synopsis = README[README.index("## CLI"):]
    synopsis = synopsis[synopsis.index("```"):synopsis.index("```", synopsis.index("```") + 3)]
    listed = set(re.findall(r"^kata-sizing (\w+)", synopsis, re.M))
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    assert listed == set(subparsers.choices)
