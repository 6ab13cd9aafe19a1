// SPDX-License-Identifier: MIT
// Pays several recipients of one ERC-20 in one transaction (several Transfer logs in one tx), as
// exchanges' batched withdrawals do. The payer approves this contract first.
pragma solidity ^0.8.20;

interface IERC20Like {
    function transferFrom(address from, address to, uint256 value) external returns (bool);
}

contract BatchTransfer {
    function transferMany(address token, address[] calldata to, uint256[] calldata amounts) external {
        require(to.length == amounts.length, "lengths");
        for (uint256 i = 0; i < to.length; i++) {
            require(IERC20Like(token).transferFrom(msg.sender, to[i], amounts[i]), "transfer failed");
        }
    }
}
