"""The common English words that synthetic text is made of, in one fixed order.

The simulated worker's output (:mod:`fairserve.core.tokenizer`) draws its words from this list
by index, and ``fairserve bench`` writes token ids as text with one word per id
(:mod:`fairserve.bench.prompts`). Both depend on the exact order: a word moved or added changes
the simulated worker's output text, the token ids it hashes to, and the text bench sends. So
there is one list, here at the bottom of the layers, and its order never changes; a caller that
wants fewer words takes a selection of it.
"""

from __future__ import annotations

_TEXT = (
    "the of and to in is was for on with as by at from that this it be are or an have not "
    "but they which one you were all we when there can more has been if will their so out "
    "about up what time into only new some could these two may first then do any like my "
    "now over such our man me even most made after also did many before must through back "
    "years where much your way well down should because each just those people how too "
    "little state good very make world still own see men work long get here between both "
    "life being under never day same another know while last might us great old year off "
    "come since against go came right used take three states himself few house use during "
    "without again place around however home small found thought went say part once high "
    "general upon school every does got united left number course war until always away "
    "something fact though water less public put think almost hand enough far took head "
    "yet government system better set told nothing night end why called eyes find going "
    "look asked later knew point next program city business give group toward young days "
    "let room president side social given present several order national possible rather "
    "second face per among form important often things looked early white case john become "
    "large big need four within felt along children saw best church ever least power "
    "development light thing seemed family interest want members mind country area others "
    "done turned although open god service certain kind problem began different door thus "
    "help sense means whole matter perhaps itself york times law human line above name "
    "example action company hands local show whether five history gave today either act "
    "feet across taken past quite anything seen having death experience body word half "
    "really week field car words already themselves information tell together college shall"
)

WORDS: tuple[str, ...] = tuple(_TEXT.split())
"""Distinct common words (no spaces, no punctuation: each is one piece of the tokenizer)."""
