"""Lexicon, particles and syntax-tree types of the built-in Korean→English toy corpus.

Every entry lists its Korean and English forms explicitly (Korean verbs have irregular
stems: 만들다 → 만든다, 걷다 → 걸었다, 돕다 → 도왔다), so the grammar in
:mod:`qkv.data.toy` only has to choose and arrange words, never to inflect them.

Tags say which nouns may fill which slot, so sentences are not only grammatical but
mostly sensible: ``eat`` takes ``food``, ``read`` takes ``text``, subjects are ``animate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Noun", "Verb", "Adjective", "TimeAdverb", "NOUNS", "PLACES", "VERBS", "ADJECTIVES"]
__all__ += ["TIMES", "TENSES", "Nominal", "NP", "RelClause", "Clause", "Sentence", "np", "verb"]
__all__ += ["has_batchim", "particle"]

TENSES = ("past", "present", "future")


@dataclass(frozen=True)
class Noun:
    """A noun: Korean form, English words, semantic tags.

    ``count`` is False for mass nouns (no "a"); ``prep`` is the English preposition
    used when the noun names a place ("in the park").
    """

    ko: str
    en: tuple[str, ...]
    tags: frozenset[str]
    count: bool = True
    prep: str = ""


@dataclass(frozen=True)
class Verb:
    """A verb with its Korean forms and English forms.

    Korean: finite past/present (plain style), prenominal past/present/future forms for
    relative clauses (잡은/잡는/잡을; the future finite form is ``rel_future + 것이다``),
    and the connective ``-고`` form that joins clauses. English: base, 3rd-person
    singular present and past.
    """

    ko_past: str
    ko_present: str
    rel_future: str
    rel_past: str
    rel_present: str
    connective: str
    en_base: str
    en_3sg: str
    en_past: str
    subj: frozenset[str]
    obj: frozenset[str] | None  # None: intransitive

    @property
    def transitive(self) -> bool:
        """Whether the verb takes an object."""
        return self.obj is not None


@dataclass(frozen=True)
class Adjective:
    """A prenominal adjective; ``rank`` orders adjectives (opinion < size < age < colour)."""

    ko: str
    en: str
    rank: int
    tags: frozenset[str]


@dataclass(frozen=True)
class TimeAdverb:
    """A sentence-level time expression and the tenses it goes with."""

    ko: tuple[str, ...]
    en: tuple[str, ...]
    tenses: frozenset[str]


def _tags(text: str) -> frozenset[str]:
    return frozenset(text.split())


def _nouns(tags: str, entries: str, count: bool = True) -> list[Noun]:
    """Parse ``"고양이:cat 개:dog"``; underscores join multi-word English nouns."""
    out = []
    for entry in entries.split():
        ko, en = entry.split(":")
        extra = ""
        if "/" in en:
            en, extra = en.split("/")
        out.append(Noun(ko, tuple(en.split("_")), _tags(tags + " " + extra), count))
    return out


NOUNS: tuple[Noun, ...] = tuple(
    _nouns(
        "animate animal",
        "고양이:cat 개:dog 쥐:mouse 새:bird 소:cow 말:horse 토끼:rabbit 곰:bear 여우:fox "
        "호랑이:tiger 사자:lion 원숭이:monkey 돼지:pig 오리:duck",
    )
    + _nouns(
        "animate person",
        "아이:child 소년:boy 소녀:girl 남자:man 여자:woman 학생:student 선생님:teacher "
        "의사:doctor 요리사:cook 농부:farmer 군인:soldier 가수:singer 친구:friend 아기:baby "
        "할머니:grandmother 할아버지:grandfather 왕:king 공주:princess 경찰관:police_officer",
    )
    + _nouns(
        "thing",
        "책:book/text 편지:letter/text 공:ball/throw 모자:hat/made 가방:bag/open 의자:chair/made "
        "상자:box/open 꽃:flower 그림:picture/made 자동차:car 컵:cup 열쇠:key/throw 우산:umbrella "
        "시계:watch 연필:pencil/throw 창문:window/open 문:door/open 돌:stone/throw "
        "장난감:toy/made",
    )
    + _nouns("food", "사과:apple/throw 케이크:cake/made 달걀:egg 오렌지:orange 생선:fish")
    + _nouns("food made", "빵:bread 밥:rice 수프:soup", count=False)
    + _nouns("drink", "우유:milk 물:water 주스:juice", count=False)
)

PLACES: tuple[Noun, ...] = tuple(
    Noun(ko, (en,), _tags("place"), True, prep)
    for ko, en, prep in [
        ("공원", "park", "in"),
        ("학교", "school", "at"),
        ("시장", "market", "at"),
        ("도서관", "library", "in"),
        ("부엌", "kitchen", "in"),
        ("정원", "garden", "in"),
        ("숲", "forest", "in"),
        ("거리", "street", "on"),
        ("방", "room", "in"),
        ("식당", "restaurant", "at"),
        ("역", "station", "at"),
        ("마을", "village", "in"),
        ("도시", "city", "in"),
        ("집", "house", "in"),
    ]
)


def _verb(ko: str, en: str, subj: str = "animate", obj: str | None = None) -> Verb:
    """Build a verb from ``"past present rel_future rel_past rel_present connective"``."""
    past, present, rel_fut, rel_past, rel_pres, conn = ko.split()
    base, third, en_past = en.split()
    return Verb(
        past,
        present,
        rel_fut,
        rel_past,
        rel_pres,
        conn,
        base,
        third,
        en_past,
        _tags(subj),
        None if obj is None else _tags(obj),
    )


def _hada(stem: str, en: str, subj: str = "animate", obj: str | None = None) -> Verb:
    """A regular 하다 verb (좋아하다, 공부하다): every form follows from the stem."""
    forms = f"{stem}했다 {stem}한다 {stem}할 {stem}한 {stem}하는 {stem}하고"
    return _verb(forms, en, subj, obj)


_ANY = "animate thing food drink"

TRANSITIVE: tuple[Verb, ...] = (
    _verb("잡았다 잡는다 잡을 잡은 잡는 잡고", "catch catches caught", obj="animal throw"),
    _verb("먹었다 먹는다 먹을 먹은 먹는 먹고", "eat eats ate", obj="food"),
    _verb("보았다 본다 볼 본 보는 보고", "see sees saw", obj=_ANY),
    _hada("좋아", "like likes liked", obj=_ANY),
    _verb("만들었다 만든다 만들 만든 만드는 만들고", "make makes made", "person", "made"),
    _verb("읽었다 읽는다 읽을 읽은 읽는 읽고", "read reads read", "person", "text"),
    _verb("썼다 쓴다 쓸 쓴 쓰는 쓰고", "write writes wrote", "person", "text"),
    _verb("샀다 산다 살 산 사는 사고", "buy buys bought", "person", "thing food drink"),
    _verb("찾았다 찾는다 찾을 찾은 찾는 찾고", "find finds found", obj="animate thing"),
    _verb("씻었다 씻는다 씻을 씻은 씻는 씻고", "wash washes washed", "person", "animal thing"),
    _verb("그렸다 그린다 그릴 그린 그리는 그리고", "draw draws drew", "person", _ANY),
    _verb("밀었다 민다 밀 민 미는 밀고", "push pushes pushed", obj="animate thing"),
    _verb("따랐다 따른다 따를 따른 따르는 따르고", "follow follows followed", obj="animate"),
    _verb("도왔다 돕는다 도울 도운 돕는 돕고", "help helps helped", obj="animate"),
    _verb("불렀다 부른다 부를 부른 부르는 부르고", "call calls called", obj="animate"),
    _verb("만났다 만난다 만날 만난 만나는 만나고", "meet meets met", obj="animate"),
    _verb("쫓았다 쫓는다 쫓을 쫓은 쫓는 쫓고", "chase chases chased", obj="animate"),
    _verb("안았다 안는다 안을 안은 안는 안고", "hug hugs hugged", obj="animate"),
    _hada("기억", "remember remembers remembered", obj="animate thing"),
    _verb("던졌다 던진다 던질 던진 던지는 던지고", "throw throws threw", "person", "throw"),
    _verb("팔았다 판다 팔 판 파는 팔고", "sell sells sold", "person", "thing food drink"),
    _verb("마셨다 마신다 마실 마신 마시는 마시고", "drink drinks drank", obj="drink"),
    _verb("열었다 연다 열 연 여는 열고", "open opens opened", "person", "open"),
)

INTRANSITIVE: tuple[Verb, ...] = (
    _verb("잤다 잔다 잘 잔 자는 자고", "sleep sleeps slept"),
    _verb("달렸다 달린다 달릴 달린 달리는 달리고", "run runs ran"),
    _verb("웃었다 웃는다 웃을 웃은 웃는 웃고", "laugh laughs laughed"),
    _verb("울었다 운다 울 운 우는 울고", "cry cries cried"),
    _verb("걸었다 걷는다 걸을 걸은 걷는 걷고", "walk walks walked"),
    _verb("앉았다 앉는다 앉을 앉은 앉는 앉고", "sit sits sat"),
    _verb("춤췄다 춤춘다 춤출 춤춘 춤추는 춤추고", "dance dances danced"),
    _hada("노래", "sing sings sang"),
    _hada("일", "work works worked", "person"),
    _verb("놀았다 논다 놀 논 노는 놀고", "play plays played"),
    _verb("쉬었다 쉰다 쉴 쉰 쉬는 쉬고", "rest rests rested"),
    _hada("수영", "swim swims swam"),
    _verb("기다렸다 기다린다 기다릴 기다린 기다리는 기다리고", "wait waits waited"),
    _hada("공부", "study studies studied", "person"),
    _hada("점프", "jump jumps jumped"),
    _verb("넘어졌다 넘어진다 넘어질 넘어진 넘어지는 넘어지고", "fall falls fell"),
    _verb("숨었다 숨는다 숨을 숨은 숨는 숨고", "hide hides hid"),
    _hada("도착", "arrive arrives arrived"),
    _verb("소리쳤다 소리친다 소리칠 소리친 소리치는 소리치고", "shout shouts shouted", "person"),
)

VERBS: tuple[Verb, ...] = TRANSITIVE + INTRANSITIVE

# rank: 0 opinion, 1 size/weight, 2 age/temperature, 3 colour (English adjective order)
ADJECTIVES: tuple[Adjective, ...] = tuple(
    Adjective(ko, en, int(rank), _tags(tags.replace(",", " ")))
    for ko, en, rank, tags in (
        line.split()
        for line in """
        큰 big 1 animate,thing,food,place
        작은 small 1 animate,thing,food,place
        무거운 heavy 1 thing
        빨간 red 3 animal,thing,food
        파란 blue 3 animal,thing
        하얀 white 3 animal,thing
        검은 black 3 animal,thing
        노란 yellow 3 animal,thing,food
        예쁜 pretty 0 animate,thing,place
        귀여운 cute 0 animate
        행복한 happy 0 animate
        슬픈 sad 0 animate
        배고픈 hungry 0 animate
        용감한 brave 0 animate
        똑똑한 smart 0 animate
        조용한 quiet 0 animate,place
        깨끗한 clean 0 thing,place
        더러운 dirty 0 animal,thing,place
        맛있는 delicious 0 food,drink
        늙은 old 2 animate
        젊은 young 2 person
        새로운 new 2 thing,place
        오래된 old 2 thing,place
        뜨거운 hot 2 food,drink
        차가운 cold 2 food,drink
        """.strip().splitlines()
    )
)

TIMES: tuple[TimeAdverb, ...] = tuple(
    TimeAdverb(tuple(ko.split("_")), tuple(en.split("_")), _tags(tenses.replace(",", " ")))
    for ko, en, tenses in (
        line.split()
        for line in """
        어제 yesterday past
        오늘 today past,present,future
        내일 tomorrow future
        지금 now present
        매일 every_day present
        아침에 in_the_morning past,present,future
        밤에 at_night past,present,future
        작년에 last_year past
        지난주에 last_week past
        내년에 next_year future
        다음_주에 next_week future
        주말마다 every_weekend present
        일요일에 on_sunday past,present,future
        """.strip().splitlines()
    )
)


# --------------------------------------------------------------------------- syntax tree


@dataclass(eq=False)
class Nominal:
    """One noun with its adjectives, optional "a" (Korean 한) and relative clause."""

    noun: Noun
    adjs: list[Adjective] = field(default_factory=list)
    indefinite: bool = False
    rel: RelClause | None = None
    depth: int = 0


@dataclass(eq=False)
class NP:
    """A noun phrase: one nominal, or two joined by 와/과 ("and").

    ``allowed`` holds the tags of nouns that fit the phrase's slot (used when coordinating).
    """

    items: list[Nominal]
    allowed: frozenset[str] = frozenset({"animate"})

    @property
    def plural(self) -> bool:
        """Coordinated subjects take plural agreement ("the cat and the dog sleep")."""
        return len(self.items) > 1


@dataclass(eq=False)
class RelClause:
    """A relative clause; ``gap`` is the role the head noun plays in it ("subj" or "obj")."""

    verb: Verb
    tense: str
    gap: str
    arg: NP | None = None


@dataclass(eq=False)
class Clause:
    """Subject, verb, optional object and optional place ("공원에서" → "in the park")."""

    subj: NP
    verb: Verb
    obj: NP | None = None
    place: Nominal | None = None


@dataclass(eq=False)
class Sentence:
    """Clauses joined by -고 ("and"), sharing one tense and an optional time adverb."""

    clauses: list[Clause]
    tense: str
    time: TimeAdverb | None = None
    topic: bool = False  # first subject marked with 은/는 instead of 이/가


def np(*korean_nouns: str) -> NP:
    """Build a noun phrase from Korean nouns of the lexicon (two nouns: coordinated)."""
    by_ko = {n.ko: n for n in NOUNS + PLACES}
    return NP([Nominal(by_ko[k]) for k in korean_nouns])


def verb(english_base: str) -> Verb:
    """Look a verb up by its English base form ("catch")."""
    return next(v for v in VERBS if v.en_base == english_base)


# ------------------------------------------------------------------------------ Korean


def has_batchim(word: str) -> bool:
    """Whether a Hangul word ends in a final consonant (batchim).

    Args:
        word: a word whose last character is a precomposed Hangul syllable.

    Returns:
        ``(ord(last) - 0xAC00) % 28 != 0``.
    """
    last = word[-1]
    if not 0xAC00 <= ord(last) <= 0xD7A3:
        raise ValueError(f"not a Hangul syllable: {last!r}")
    return (ord(last) - 0xAC00) % 28 != 0


_PARTICLES = {"subj": ("이", "가"), "obj": ("을", "를"), "topic": ("은", "는"), "and": ("과", "와")}


def particle(word: str, role: str) -> str:
    """Attach the particle for ``role`` (subj, obj, topic, and, place) to a noun.

    Args:
        word: the noun.
        role: one of ``subj`` (이/가), ``obj`` (을/를), ``topic`` (은/는), ``and`` (과/와),
            ``place`` (에서).

    Returns:
        The noun with its particle, e.g. ``particle("고양이", "subj") == "고양이가"``.
    """
    if role == "place":
        return word + "에서"
    after_consonant, after_vowel = _PARTICLES[role]
    return word + (after_consonant if has_batchim(word) else after_vowel)
