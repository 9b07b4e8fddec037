"""The suite's tool classes: a file store, a car with a precondition, a messenger with a login.

The conventions are BFCL's: state lives in public attributes (what the checker compares),
`_load_scenario(scenario, long_context)` sets it up, results are dicts, and failures are
`{"error": ...}` results worded for the executor's classifier ("no such ..." is `not_found`,
"log in" is `auth_required`, anything else `tool_error`). In long-context mode each class adds
distracting content (extra files, extra messages, a trip log) to what the agent reads.
"""

import copy

FOLDERS = ("docs", "work", "trash")
LIGHT_MODES = ("on", "off", "auto")
DRIVE_MODES = ("eco", "sport")
USERS = ("ana", "ben", "cleo", "dan", "eve")
AC_RANGE = (16, 28)

# Long-context distractors; the task generator never uses these names or senders.
EXTRA_FILES = {
    f"{name}.txt": {"folder": FOLDERS[i % len(FOLDERS)], "text": text}
    for i, (name, text) in enumerate(
        [
            ("memo", "old notes"),
            ("log", "nothing new"),
            ("idea", "a new app"),
            ("old", "last year"),
            ("data", "numbers"),
            ("copy", "same as before"),
        ]
    )
}
EXTRA_MESSAGES = [
    {"from": "news", "text": "top stories today"},
    {"from": "shop", "text": "your order shipped"},
    {"from": "bank", "text": "new statement"},
    {"from": "news", "text": "weather is sunny"},
]
TRIP_LOG = ["door opened", "seat moved", "radio on", "tire check ok"]


def _doc(name: str, description: str, properties: dict, required: list[str]) -> dict:
    """A function doc in BFCL's format (types "dict", "string", "integer")."""
    parameters = {"type": "dict", "properties": properties, "required": required}
    return {"name": name, "description": description, "parameters": parameters}


def _string(description: str, enum: tuple[str, ...] = ()) -> dict:
    """A string parameter, optionally restricted to `enum`."""
    return {"type": "string", "description": description, **({"enum": list(enum)} if enum else {})}


class Files:
    """A few named text files, each in one of FOLDERS; `changes` counts moves and deletes."""

    def __init__(self) -> None:
        self.files: dict[str, dict] = {}
        self.changes = 0

    def _load_scenario(self, scenario: dict, long_context: bool = False) -> None:
        self.files = copy.deepcopy(scenario.get("files", {}))
        self.changes = 0
        if long_context:
            self.files.update(copy.deepcopy(EXTRA_FILES))

    def list_files(self, folder: str) -> dict:
        """Lists the files of one folder."""
        return {"files": sorted(n for n, f in self.files.items() if f["folder"] == folder)}

    def read_file(self, name: str) -> dict:
        """Returns the text of a file."""
        if name not in self.files:
            return {"error": f"read_file: no such file {name}"}
        return {"text": self.files[name]["text"]}

    def move_file(self, name: str, folder: str) -> dict:
        """Moves a file to a folder."""
        if name not in self.files:
            return {"error": f"move_file: no such file {name}"}
        self.files[name]["folder"] = folder
        self.changes += 1
        return {"moved": name, "folder": folder}

    def delete_file(self, name: str) -> dict:
        """Deletes a file."""
        if name not in self.files:
            return {"error": f"delete_file: no such file {name}"}
        del self.files[name]
        self.changes += 1
        return {"deleted": name}


class Car:
    """A car: the engine starts only while the brake is pressed; `changes` counts settings made.

    The counter makes a repeated or guessed setting visible to the state check even when a
    later call sets the right value (a setter alone is idempotent).
    """

    def __init__(self) -> None:
        self.engine = "off"
        self.mode = "eco"
        self.brake = "released"
        self.lights = "off"
        self.ac_temp = 20
        self.changes = 0
        self._trip_log: list[str] = []

    def _load_scenario(self, scenario: dict, long_context: bool = False) -> None:
        self.lights = scenario.get("lights", "off")
        self.ac_temp = scenario.get("ac_temp", 20)
        self._trip_log = list(TRIP_LOG) if long_context else []

    def _answer(self, result: dict) -> dict:
        """Adds the trip log to a result in long-context mode."""
        return {**result, "log": self._trip_log} if self._trip_log else result

    def press_brake(self) -> dict:
        """Presses the brake pedal."""
        self.brake = "pressed"
        return self._answer({"brake": "pressed"})

    def start_engine(self, mode: str) -> dict:
        """Starts the engine in a drive mode."""
        if self.brake != "pressed":
            return {"error": "start_engine: the brake must be pressed to start the engine"}
        self.engine, self.mode = "on", mode
        self.changes += 1
        return self._answer({"engine": "on", "mode": mode})

    def set_lights(self, mode: str) -> dict:
        """Sets the headlights."""
        self.lights = mode
        self.changes += 1
        return self._answer({"lights": mode})

    def set_ac(self, temp: int) -> dict:
        """Sets the air conditioning temperature in degrees."""
        low, high = AC_RANGE
        if not low <= temp <= high:
            return {"error": f"set_ac: temp must be between {low} and {high}"}
        self.ac_temp = temp
        self.changes += 1
        return self._answer({"ac_temp": temp})


class Messenger:
    """Sends and reads messages for the user who logged in."""

    def __init__(self) -> None:
        self.user: str | None = None
        self.sent: list[dict] = []
        self._inbox: list[dict] = []

    def _load_scenario(self, scenario: dict, long_context: bool = False) -> None:
        self.user = scenario.get("user")
        self.sent = []
        self._inbox = copy.deepcopy(scenario.get("inbox", []))
        if long_context:
            self._inbox = copy.deepcopy(EXTRA_MESSAGES) + self._inbox

    def login(self, user: str) -> dict:
        """Logs in as a user."""
        self.user = user
        return {"user": user}

    def send(self, to: str, text: str) -> dict:
        """Sends a text to a contact."""
        if self.user is None:
            return {"error": "send: log in before sending"}
        if to not in USERS:
            return {"error": f"send: no such contact {to}"}
        self.sent.append({"to": to, "text": text})
        return {"sent": len(self.sent), "to": to}

    def read_inbox(self) -> dict:
        """Returns the messages received."""
        if self.user is None:
            return {"error": "read_inbox: log in to read messages"}
        return {"messages": self._inbox}


CLASSES = {"Files": Files, "Car": Car, "Messenger": Messenger}

DOCS = {
    "list_files": _doc(
        "list_files",
        "List the files in a folder.",
        {"folder": _string("Folder.", FOLDERS)},
        ["folder"],
    ),
    "read_file": _doc("read_file", "Read a file.", {"name": _string("File name.")}, ["name"]),
    "move_file": _doc(
        "move_file",
        "Move a file to a folder.",
        {"name": _string("File name."), "folder": _string("Target folder.", FOLDERS)},
        ["name", "folder"],
    ),
    "delete_file": _doc("delete_file", "Delete a file.", {"name": _string("File name.")}, ["name"]),
    "press_brake": _doc("press_brake", "Press the brake pedal.", {}, []),
    "start_engine": _doc(
        "start_engine",
        "Start the engine.",
        {"mode": _string("Drive mode.", DRIVE_MODES)},
        ["mode"],
    ),
    "set_lights": _doc(
        "set_lights", "Set the headlights.", {"mode": _string("Light mode.", LIGHT_MODES)}, ["mode"]
    ),
    "set_ac": _doc(
        "set_ac",
        "Set the air conditioning.",
        {"temp": {"type": "integer", "description": f"Degrees, {AC_RANGE[0]} to {AC_RANGE[1]}."}},
        ["temp"],
    ),
    "login": _doc("login", "Log in to the messenger.", {"user": _string("User.", USERS)}, ["user"]),
    "send": _doc(
        "send",
        "Send a message.",
        {"to": _string("Contact name."), "text": _string("Message text.")},
        ["to", "text"],
    ),
    "read_inbox": _doc("read_inbox", "Read your messages.", {}, []),
}

# Which class owns each tool, in the order docs are shown.
TOOLS_OF = {
    "Files": ("list_files", "read_file", "move_file", "delete_file"),
    "Car": ("press_brake", "start_engine", "set_lights", "set_ac"),
    "Messenger": ("login", "send", "read_inbox"),
}
