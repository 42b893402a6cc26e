"""The SQL endpoint's row scope matches server names as `fnmatch.fnmatchcase` does, for the globs a read token
may carry (`*`, `?`, any other character itself): the JVM's translation, property-tested against Python's."""

from __future__ import annotations

import fnmatch
import random

#: Server-name characters, regex metacharacters and the two wildcards.
GLOB_CHARS = "sim-01.*?\\^$|+(){}é"
NAME_CHARS = "sim-01.\\^$|+(){}é\n"


def test_the_jvm_glob_regex_matches_what_fnmatchcase_matches(spark):
    jvm = spark._jvm
    rng = random.Random(58)
    for _ in range(300):
        glob = "".join(rng.choice(GLOB_CHARS) for _ in range(rng.randint(1, 8)))
        names = ["".join(rng.choice(NAME_CHARS) for _ in range(rng.randint(0, 8))) for _ in range(12)]
        names += [glob.replace("*", "").replace("?", "s")]  # one name the glob matches
        regex = jvm.java.util.regex.Pattern.compile(jvm.metricslake.spark.LakeRowScope.globRegex(glob))
        # RLIKE finds the regex anywhere: the anchors must make it match whole names only, as fnmatchcase does.
        found = [regex.matcher(name).find() for name in names]
        assert found == [fnmatch.fnmatchcase(name, glob) for name in names], glob
