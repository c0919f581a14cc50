"""Helpers the tests share: servers, proxies, a Ray head, data (imported as ``support.<module>``)."""
