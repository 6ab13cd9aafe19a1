"""What the pages say: the API's errors in words a customer can act on, and sentences two places
print (a page and the script that updates it), made here once so they cannot differ."""

from __future__ import annotations

from vpsshop.dashboard.web import format_usd, format_when
from vpsshop.errors import ApiError
from vpsshop.servers.orders import QuoteOut

LEDGER_REASONS = {
    "topup": "Top-up",
    "admin_credit": "Credit from support",
    "admin_debit": "Debit by support",
    "reversal": "Held payment not settled",
    "order": "Server order",
    "renewal": "Server renewal",
    "resize": "Server resize",
    "refund": "Refund",
}
FIELD_NAMES = {
    "plan": "Plan",
    "location": "Location",
    "os": "Operating system",
    "cycle": "Billing cycle",
    "hostname": "Hostname",
    "root_password": "Root password",
    "amount": "Amount",
    "coin": "Coin",
    "name": "Name",
    "public_key": "Public key",
    "user_data": "User data",
    "url": "URL",
    "description": "Description",
}
FRIENDLY = {
    "amount_too_low": "The smallest top-up is $25.",
    "amount_too_high": "The largest top-up is $2,000.",
    "invalid_amount": "Enter the amount in US dollars, like 30 or 30.50 (at most two decimals).",
    "invalid_hostname": "A hostname is 1 to 63 letters, digits and hyphens, not starting or ending with a hyphen.",
    "invalid_root_password": "A root password is 10 to 128 printable characters (letters, digits, symbols, "
    "spaces); leave it empty to have one generated.",
    "invalid_ssh_keys": "Choose SSH keys from the list (at most 10); add keys on the SSH keys page.",
    "invalid_periods": "Enter how many billing cycles to pay for: a whole number, at least 1.",
    "invalid_reverse_dns": "A reverse DNS name is a full domain name like mail.example.com: letters, digits and "
    "hyphens, with dots between the parts.",
    "invalid_event_types": "Choose at least one kind of event.",
    "invalid_event_id": "An event id looks like evt_… (the Events page lists them).",
    "hostname_mismatch": "That is not this server's hostname. Type it exactly as shown to confirm; nothing was done.",
    "totp_required": "Enter the code from your authenticator app (or a recovery code).",
}

PATTERN_WORDS = {
    "name": "Name: letters, digits, spaces and punctuation only.",
    "description": "Description: no control or invisible characters.",
    "public_key": "Public key: one line, like ssh-ed25519 AAAA… you@laptop.",
}


def friendly(exc: ApiError) -> str:
    """The error in words: a rewording for the codes a form field causes, else the API's own message.

    ``invalid_periods`` from the prepay horizon carries ``max_periods``: its message (how many fit)
    is the API's.
    """
    if exc.error == "invalid_periods" and "max_periods" in exc.extra:
        return exc.message
    if exc.error == "insufficient_balance":
        return (
            f"Your balance of {format_usd(exc.extra['balance'])} does not cover the price of "
            f"{format_usd(exc.extra['price'])}. Nothing was charged."
        )
    if exc.error in FRIENDLY:
        return FRIENDLY[exc.error]
    field = exc.error.removeprefix("invalid_")
    if field in PATTERN_WORDS and "should match pattern" in exc.message:
        return PATTERN_WORDS[field]
    if field in FIELD_NAMES:
        return f"{FIELD_NAMES[field]}: {exc.message.split(': ', 1)[-1]}"
    return exc.message


def cycles(count: int, cycle: str) -> str:
    unit = "year" if cycle == "annual" else "month"
    return f"{count} {unit}{'s' if count != 1 else ''}"


def renewal_words(quote: QuoteOut, cycle: str) -> str:
    """The price of a renewal as the server page and its script show it (from the API's quote)."""
    text = (
        f"{format_usd(quote.price_usd)} for {cycles(quote.periods, cycle)}: paid until {format_when(quote.expires_at)}."
    )
    if not quote.sufficient:
        text += (
            f" Your balance of {format_usd(quote.balance_usd)} is {format_usd(quote.deficit_usd)} short: top up first."
        )
    return text
